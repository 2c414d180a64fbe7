"""The job schema: typed, range-checked sections that reject unknown keys.

Field comments are the documentation (``ten-runner schema`` turns the descriptions into
editor completion). The train, data, checkpoint and model sections are derived from the
library's torch-free config dataclasses (:func:`section_from`); the model's keys depend on
its arch (:func:`model_fields`). Checks that involve several fields, building the model
and the dataset name live in :mod:`runner.job.checks`; this module never imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from runner.job.clouds import CLOUDS
from runner.job.errors import show, suggest
from runner.job.fields import (
    Bool,
    Float,
    Int,
    Section,
    Str,
    bounded,
    job_error,
    parsed_url,
)
from runner.keys import DATA_FROM_OTHER_SECTIONS, DATA_NOT_IN_JOBS, FROM_OTHER_SECTIONS
from runner.preemption.providers import NAMES as SPOT_PROVIDERS
from runner.storage import DEFAULT_STORE
from runner.storage.url import StoreURL, StoreURLError
from ten import config as ten_config
from ten.cards import ACCELERATORS, DEFAULT_ACCELERATOR
from ten.data.config import DataConfig
from ten.model.config import ARCHS as MODEL_ARCHS
from ten.model.config import TENConfig, TransformerConfig

# Names and defaults from the library's torch-free config (ten.config): one source.
Arch = Literal[MODEL_ARCHS]
Preset = Literal[ten_config.PRESET_NAMES]
ARCHS: tuple[str, ...] = get_args(Arch)
PRESETS: tuple[str, ...] = get_args(Preset)
SPOT_NOTICES = ("auto", "none", *SPOT_PROVIDERS)  # resources.spot_notice
TRACKERS = ("wandb",)  # monitor.report_to (runner.monitor.trackers)
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_URL_CHARS = 1024


def _by_arch(schema: dict[str, Any]) -> None:
    """For editors: the keys an arch's model takes, under that arch."""
    def keys(arch: str) -> dict[str, Any]:
        return {"properties": model_fields(arch).model_json_schema()["properties"]}

    schema.update({"if": {"properties": {"arch": {"const": "transformer"}},
                          "required": ["arch"]},
                   "then": keys("transformer"), "else": keys("ten"),
                   "unevaluatedProperties": False})
    schema.pop("additionalProperties", None)


class ModelSection(BaseModel):
    """The model: an architecture's preset, and any field of its config set otherwise."""

    model_config = ConfigDict(extra="allow", frozen=True, json_schema_extra=_by_arch)

    arch: Arch = Field("ten", description="model family")
    preset: Preset = Field(
        description="named size from ten.model.presets (see `ten-runner presets`)")

    @model_validator(mode="after")
    def _typed_overrides(self) -> ModelSection:
        fields = model_fields(self.arch)
        extra = self.model_extra or {}
        errors = [{"type": job_error(_unknown_field(name, self.arch, fields.model_fields),
                                     show_value=False), "loc": (name,), "input": value}
                  for name, value in extra.items() if name not in fields.model_fields]
        try:
            fields.model_validate({k: v for k, v in extra.items() if k in fields.model_fields})
        except ValidationError as e:
            errors += [_raised_again(err) for err in e.errors()]
        if errors:  # located at model.<field>, each said as the job's other fields are
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @property
    def overrides(self) -> dict[str, Any]:
        """The fields the job sets, as the library takes them (``1e3`` an int)."""
        given = model_fields(self.arch).model_validate(self.model_extra or {})
        return given.model_dump(exclude_unset=True)


def _raised_again(err: Any) -> Any:
    """One of pydantic's reported errors as it can be raised again."""
    kind = err["type"]
    if kind == "job":  # this schema's own (job_error): its message and hint
        kind = PydanticCustomError("job", err["msg"].replace("{", "{{").replace("}", "}}"),
                                   err.get("ctx"))
    return {"type": kind, "loc": err["loc"], "input": err["input"], "ctx": err.get("ctx", {})}


def _unknown_field(name: str, arch: str, known: typing.Iterable[str]) -> str:
    close = suggest(name, known)
    return f"unknown model field {show(name)} for arch {arch}" + (
        f" (did you mean {close!r}?)" if close else f" (known: {', '.join(sorted(known))})")


def section_from(config: type, name: str, exclude: frozenset[str] = frozenset(), *,
                 base: type[Section] | None = None,
                 tighten: dict[str, dict[str, Any]] | None = None,
                 rename: dict[str, str] | None = None,
                 unset_means: str | None = None) -> type:
    """A job section whose keys are the library dataclass's fields (less ``exclude``):
    each field's type made strict (:data:`Int`, :data:`Float`, ...), its
    ``ten.config.Range`` as bounds, its ``ten.config.Doc`` as description, its default; a
    field that is itself a config dataclass becomes a nested section. ``base`` adds the
    keys the job keeps here for another config; ``tighten`` adds the job's own bounds to
    a field (``{"dataset": {"default": ..., "min_length": 1}}`` makes it required);
    ``rename`` gives a field another key (``checkpoint_every`` is ``every_steps``);
    ``unset_means`` makes every field default to null, read as what it says (``"the
    preset's"``)."""
    hints = typing.get_type_hints(config, include_extras=True)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if f.name in exclude:
            continue
        if dataclasses.is_dataclass(hints[f.name]):  # a nested config: a nested section
            nested = hints[f.name]
            inner = section_from(nested, nested.__name__.replace("Config", "Section"))
            fields[f.name] = (inner, Field(default_factory=inner))
            continue
        base_type, *meta = typing.get_args(hints[f.name])
        bounds = next((dataclasses.asdict(m) for m in meta if isinstance(m, ten_config.Range)),
                      {})
        bounds = {k: v for k, v in bounds.items() if v is not None}
        doc = next((str(m) for m in meta if isinstance(m, ten_config.Doc)), None)
        extra = {"default": f.default, "description": doc, **(tighten or {}).get(f.name, {})}
        if unset_means is not None:
            extra.update(default=None, description=f"{doc} (unset: {unset_means})")
        key = (rename or {}).get(f.name, f.name)
        fields[key] = (_strict(base_type, bounds), Field(**extra))
    return create_model(name, __base__=base or Section, __doc__=config.__doc__, **fields)


def _strict(tp: Any, bounds: dict[str, float]) -> Any:
    """The job's strict form of a library type, with its bounds where a value is checked:
    on the number, on each item of a tuple, on the number of a ``number | None``."""
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = [_strict(a, bounds) for a in typing.get_args(tp)]
        return args[0] | args[1] if len(args) == 2 else tp
    if typing.get_origin(tp) is tuple:
        return tuple[tuple(Annotated[a, Strict(), Field(**bounds)] for a in typing.get_args(tp))]
    if tp is type(None):
        return tp
    if tp in (int, float):
        return bounded(tp, **bounds)
    return {bool: Bool, str: Str}.get(tp, tp)


# The train section: TrainConfig's fields, less those the job keeps in other sections
# (runner.keys.FROM_OTHER_SECTIONS says which and where).
TrainSection = section_from(ten_config.TrainConfig, "TrainSection",
                            exclude=frozenset(FROM_OTHER_SECTIONS))


def _train_fields_in(section: str, name: str) -> type:
    """The TrainConfig fields a job keeps in ``section``, under their keys there."""
    held = {f: key for f, (where, key) in FROM_OTHER_SECTIONS.items() if where == section}
    every = frozenset(f.name for f in dataclasses.fields(ten_config.TrainConfig))
    return section_from(ten_config.TrainConfig, name, exclude=every - set(held), rename=held)


_TrainingReads = _train_fields_in("data", "_TrainingReads")  # the loader's workers


# The data section: DataConfig's fields (the tokenizer nested), less the seed (the job's
# train.seed seeds both) and the knobs a job does not turn, plus TrainConfig's
# num_workers. A job names its dataset, and always holds some documents out.
DataSection = section_from(
    DataConfig, "DataSection", base=_TrainingReads,
    exclude=DATA_NOT_IN_JOBS | set(DATA_FROM_OTHER_SECTIONS),
    tighten={"dataset": {"default": ..., "min_length": 1},
             "val_fraction": {"gt": 0.0, "description": (
                 "documents held out for evaluation, by hash (more than 0: every run ends "
                 "with one; the builtin corpus has its own split)")}})


class CheckpointSection(_train_fields_in("checkpoint", "_CheckpointReads")):
    """How often the run commits a checkpoint, and how many it keeps."""

    milestone_every: bounded(int, ge=1) | None = Field(
        None, description="also keep, in the bucket, every checkpoint whose step is a "
        "multiple of this")


# The model section's overrides, one section per architecture, from the library's model
# configs. A transformer is matched to a TEN preset: it also takes that model's fields.
_TEN_FIELDS = section_from(TENConfig, "TenModelFields", unset_means="the preset's")
_MATCHED_TEN = section_from(
    TENConfig, "_MatchedTenFields",
    exclude=frozenset(f.name for f in dataclasses.fields(TransformerConfig)),
    unset_means="the preset's; shapes the TEN model the transformer is matched to")
_MODEL_FIELDS: dict[str, type[Section]] = {
    "ten": _TEN_FIELDS,
    "transformer": section_from(TransformerConfig, "TransformerModelFields",
                                base=_MATCHED_TEN, unset_means="the preset's"),
}


def model_fields(arch: str) -> type[Section]:
    """The section of fields a job may override under ``model`` for ``arch``."""
    return _MODEL_FIELDS[arch]


# Never a place for runs: the root, the kernel's and devices' pseudo file systems and what
# lies under them, the system's configuration and boot files, and the program folders.
_SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/boot")
_SYSTEM_FOLDERS = ("/", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr", "/var")


def system_directory(path: str) -> str | None:
    """What ``path`` is when it is a system directory (``"the file system's root"``,
    ``"under /proc"``, ``"/usr"``), else None; from the text alone, so a job validated on
    one machine is judged as on another."""
    if not path.startswith("/"):
        return None
    norm = os.path.normpath(path)
    norm = "/" + norm.lstrip("/")  # POSIX keeps a leading "//"
    if norm == "/":
        return "the file system's root"
    for tree in _SYSTEM_TREES:
        if norm == tree or norm.startswith(tree + "/"):
            return f"under {tree}" if norm != tree else tree
    return norm if norm in _SYSTEM_FOLDERS else None


# A word and a colon before any slash, as a URL's scheme: not a Windows drive (one letter).
_LOOKS_LIKE_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(?!//)")


class StorageSection(Section):
    """Where runs, checkpoints and shared data go: a local folder or a bucket."""

    url: Str = Field(DEFAULT_STORE, description="where runs and checkpoints go: a local path, "
                     "file:///abs/path or s3://bucket/prefix")
    endpoint_url: Str | None = Field(None, description="S3-compatible endpoint (MinIO, R2, ...)")
    region: Str | None = Field(None, description="the bucket's region; null: the SDK's "
                               "default chain")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if len(url) > MAX_URL_CHARS:  # S3 keys stop at 1024 bytes; paths soon after
            raise job_error(f"is {len(url):,} characters; at most {MAX_URL_CHARS:,}",
                            show_value=False)
        try:  # the parse open_store and every reader of the job's store take
            where = StoreURL.parse(url)
        except StoreURLError as e:
            raise job_error(e.problem, hint=e.hint or None, show_value=False) from None
        if where.is_remote:
            return url
        if looks := _LOOKS_LIKE_URL.match(url):  # s3:/bucket would train into ./s3:
            word = looks[1]
            hint = (f"did you mean {word}://{url[len(word) + 1:].lstrip('/')}?"
                    if word.lower() in ("s3", "file") else "use a local path, file:// or s3://")
            raise job_error(f"{url!r} looks like a URL but is not one (a scheme takes '://')",
                            hint=f"{hint}; a local folder named so: ./{url}", show_value=False)
        elif system := system_directory(str(where.path)):
            raise job_error(f"is {system}: runs would be written among the system's files",
                            hint="use a folder of their own, e.g. ./runs or /data/runs",
                            show_value=False)
        return url

    @field_validator("endpoint_url")
    @classmethod
    def _parsable_endpoint(cls, url: str | None) -> str | None:
        if not url:  # None or empty: AWS S3 itself
            return url
        # what botocore does with it first; an unparsable one crashed the run
        parts = parsed_url(url, hint="e.g. http://localhost:9000", show_value=False)
        if parts.username is not None or parts.password is not None:
            # it would be written into job.json and every checkpoint's config.json
            raise job_error("carries credentials (user:password@host)",
                            hint="give the keys as AWS_ACCESS_KEY_ID and "
                                 "AWS_SECRET_ACCESS_KEY in the environment",
                            show_value=False)
        return url

    @functools.cached_property
    def address(self) -> StoreURL:
        """``url`` parsed, once (the section is frozen)."""
        return StoreURL.parse(self.url)

    @property
    def is_remote(self) -> bool:
        return self.address.is_remote

    def open(self) -> Any:
        """The job's store (:func:`runner.storage.open_store`, with this section's
        endpoint and region); a bucket is checked once, StorageError in one line."""
        from runner.storage import open_store

        return open_store(self.url, self.endpoint_url or None, self.region or None)

    def local_path(self) -> Path:
        """The directory runs go under (``file://`` stripped, ``~`` expanded)."""
        return self.address.path

    def key(self) -> str:
        """This store's folder name on a machine (:meth:`StoreURL.key`)."""
        return self.address.key(self.endpoint_url or None)


class _Resources(Section):
    """The machine a submitted job asks for: GPUs, spot, image, cloud, price."""

    gpus: Int = Field(0, ge=0, description="GPUs per machine: more than 1 runs that many "
                      "ranks under torchrun")
    accelerator: Literal[ACCELERATORS] = Field(
        DEFAULT_ACCELERATOR, description="the GPU model (SkyPilot's name for it): what "
        "`export --to skypilot` asks for, and the card `validate` checks the job's memory "
        "against when gpus >= 1")
    spot: Bool = Field(False, description="a spot (preemptible) machine: watch for the "
                       "preemption notice")
    price_per_hour: bounded(float, gt=0.0) | None = Field(None, description="USD, for cost reports")
    spot_notice: Literal[SPOT_NOTICES] = Field(
        "auto", description="preemption-notice poller: auto detects the cloud when spot is "
        "true; none disables it")
    metadata_endpoint: Str | None = Field(
        None, description="metadata service base URL (default: the provider's own)")
    notice_poll_s: Float = Field(2.0, gt=0.0, description="seconds between notice polls")

    @field_validator("metadata_endpoint")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return url
        hint = "the metadata service's base URL, e.g. http://169.254.169.254"
        parts = parsed_url(url, hint=hint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise job_error("must be an http:// or https:// URL with a host", hint=hint)
        return url
    # Where `ten-runner submit` puts the job (see runner/provision/).
    image: Str = Field("ghcr.io/ten-runner/ten-runner:latest",
                       description="container image run by `submit` and `export`")
    max_restarts: Int = Field(3, ge=0, description="managed jobs: relaunches after a crash "
                              "(preemptions always relaunch)")
    max_preemptions: bounded(int, ge=0) | None = Field(
        None, description="managed jobs: relaunches after a preemption, at most this "
        "many (a process killed for memory also reads as one); null: no limit")


# Each cloud's own keys, under its name (resources.aws): declared by its module in
# runner/job/clouds/, so adding a cloud edits no list here.
ResourcesSection = create_model(
    "ResourcesSection", __base__=_Resources, __doc__=_Resources.__doc__,
    **{cloud.name: (cloud.section, Field(default_factory=cloud.section, description=(
        f"`submit --to {cloud.name}` only: {cloud.summary}")))
       for cloud in CLOUDS if cloud.section is not None})


class MonitorSection(Section):
    """GPU sampling, the status heartbeat and when a run counts as stalled."""

    gpu_sample_s: Float = Field(10.0, gt=0.0, description="seconds between NVML GPU samples")
    heartbeat_s: Float = Field(30.0, gt=0.0, description="seconds between status.json updates")
    stall_after_s: Float = Field(600.0, gt=0.0, description="no step for this long: stalled")
    exit_on_stall: Bool = Field(False, description="exit (code 1) when stalled, so a "
                                "supervisor relaunches and resumes")
    health_gate: Bool = Field(True, description="check the GPU before training")
    report_to: list[Literal[TRACKERS]] = Field(
        default_factory=list, description="experiment trackers that also get the run's "
        "figures: wandb (offline under the run directory without WANDB_API_KEY); "
        "metrics.jsonl and TensorBoard always do")


def slugify(name: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", name.lower())).strip("-")[:63]


class JobSchema(BaseModel):
    """A ten-runner job: what to train, on what data, for how long, and where it goes."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="ten-runner job")

    name: Str = Field(description="run name, used in paths: [a-z0-9-], 1-63 characters")
    model: ModelSection
    data: DataSection
    train: TrainSection
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    storage: StorageSection = Field(default_factory=StorageSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    monitor: MonitorSection = Field(default_factory=MonitorSection)

    @field_validator("name")
    @classmethod
    def _slug(cls, name: str) -> str:
        if not name:
            raise job_error("must not be empty", hint="a slug like 'tiny-cpu'")
        if len(name) > 63:
            fixed = slugify(name) if len(name) <= 200 else ""  # a slug of a huge value helps
            raise job_error(f"must be at most 63 characters (it is used in paths); this "
                            f"one has {len(name):,}", hint=f"try {fixed!r}" if fixed else "")
        if not SLUG.match(name):
            fixed = slugify(name)
            raise job_error("must be 1-63 characters of a-z, 0-9 and '-', starting with a "
                            "letter or digit (it is used in paths)",
                            hint=f"try {fixed!r}" if fixed else "a slug like 'tiny-cpu'")
        return name
