"""Hear the spot-preemption notice while there is still time to checkpoint.

Every cloud warns a spot VM before reclaiming it, but only through its metadata
service: AWS about 2 minutes ahead, GCP and Azure about 30 s. A SIGTERM, where one
reaches the container at all, can come at the very end of that window (AWS, Azure),
so a job that waits for the signal loses everything since its last periodic
checkpoint. A :class:`NoticeWatcher` polls the metadata service on a daemon thread
and calls ``on_notice`` once, at the start of the window.

One concept per module: :mod:`.notices` (a notice as data), :mod:`.http` (the one
request), :mod:`.providers` (one module per metadata service: its parser, poller and
probe, declared), :mod:`.detection` (which one answers here), :mod:`.deadlines` (the
window's maths, said to the user), :mod:`.watcher` (the thread).
"""

from runner.preemption.deadlines import emergency_report, notice_window_s, startup_warning
from runner.preemption.detection import DEFAULT_ENDPOINTS, detect_provider, resolve_provider
from runner.preemption.notices import MetadataError, Notice, time_left_s
from runner.preemption.providers import NAMES as PROVIDERS
from runner.preemption.providers.aws import parse_aws_instance_action
from runner.preemption.providers.azure import AZURE_NOTICE_EVENTS, parse_azure_scheduled_events
from runner.preemption.providers.gcp import parse_gcp_preempted
from runner.preemption.watcher import NoticeWatcher, _ErrorThrottle

__all__ = ["AZURE_NOTICE_EVENTS", "DEFAULT_ENDPOINTS", "PROVIDERS", "MetadataError", "Notice",
           "NoticeWatcher", "_ErrorThrottle", "detect_provider", "emergency_report",
           "notice_window_s", "parse_aws_instance_action", "parse_azure_scheduled_events",
           "parse_gcp_preempted", "resolve_provider", "startup_warning", "time_left_s"]
