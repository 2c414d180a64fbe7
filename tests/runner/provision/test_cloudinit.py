"""The cloud-init user data: the checked-in example is the current rendering, hostile
values come back exactly (through YAML, shlex and a real shell), secrets are refused,
and the exit watcher powers the VM off exactly when the job is over on it."""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from runner.exit_codes import ExitCode
from runner.provision import cloudinit
from runner.provision.base import ProvisionError
from runner.provision.cloudinit import (
    CACHE_HOST_DIR,
    CONTAINER,
    FINAL_EXIT_CODES,
    WATCHER,
    parse_user_data,
    render_user_data,
    watch_script,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "infra" / "cloud-init" / "user-data.yaml"
RENDERED_BY = "#   python -m runner.provision.cloudinit "
BASE = dict(image="ghcr.io/example/ten-runner:0.1.0", job_url="s3://ten-runs/runs/j/job.yaml",
            job_id="j-3f9a1c")


def example_args() -> list[str]:
    lines = [line for line in EXAMPLE.read_text().splitlines() if line.startswith(RENDERED_BY)]
    assert len(lines) == 1, "the example must say how it was rendered"
    return shlex.split(lines[0][len(RENDERED_BY):])


def test_the_example_is_the_current_rendering(capsys):
    assert cloudinit.main(example_args()) == 0
    rendered = capsys.readouterr().out
    assert rendered == EXAMPLE.read_text(), (
        "infra/cloud-init/user-data.yaml is stale: re-render it with the command in its "
        "header")


def test_the_module_runs_as_a_script():
    out = subprocess.run([sys.executable, "-m", "runner.provision.cloudinit", *example_args()],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == EXAMPLE.read_text()


def run_line(doc: dict) -> str:
    lines = [c for c in doc["runcmd"] if isinstance(c, str) and c.startswith("docker run ")]
    assert len(lines) == 1
    return lines[0]


def test_structure():
    text = render_user_data(**BASE, env={"AWS_REGION": "eu-west-1"}, max_restarts=2,
                            stop_timeout_s=100)
    assert len(text.encode()) < cloudinit.USER_DATA_LIMIT
    doc = parse_user_data(text)
    files = {f["path"]: f for f in doc["write_files"]}
    assert files[WATCHER]["content"] == watch_script()
    assert files[WATCHER]["permissions"] == "0755"
    assert "TimeoutStopSec=120" in files[cloudinit.DOCKER_DROPIN]["content"]
    argv = shlex.split(run_line(doc))
    assert argv[:3] == ["docker", "run", "--detach"]
    assert argv[-3:] == ["||", "systemctl", "poweroff"]
    assert argv[-6:-3] == [BASE["image"], "run", BASE["job_url"]]
    assert "--restart=on-failure:2" in argv
    assert argv[argv.index("--stop-timeout") + 1] == "100"
    assert argv[argv.index("--volume") + 1] == f"{CACHE_HOST_DIR}:/cache"
    assert argv[argv.index("--name") + 1] == CONTAINER
    assert ["--env", "AWS_REGION=eu-west-1"] == argv[argv.index("--env"):argv.index("--env") + 2]
    assert ["--gpus", "all"] == argv[argv.index("--gpus"):argv.index("--gpus") + 2]
    # The watcher listens before the container can exit; the image is pulled first.
    order = [c[0] if isinstance(c, list) else c.split()[0] for c in doc["runcmd"]]
    assert order.index("systemd-run") < order.index("docker")
    assert order.index("for") < order.index("docker")
    watch = next(c for c in doc["runcmd"] if isinstance(c, list) and c[0] == "systemd-run")
    assert watch[-4:] == [WATCHER, CONTAINER, "2", "100"]
    install = next(c for c in doc["runcmd"] if isinstance(c, list) and c[0] == "install")
    assert install[-1] == CACHE_HOST_DIR and str(cloudinit.IMAGE_UID) in install


def test_no_restarts_means_no_restart_policy():
    """docker reads on-failure:0 as "no limit"."""
    argv = shlex.split(run_line(parse_user_data(render_user_data(**BASE, max_restarts=0))))
    assert "--restart=no" in argv and not any("on-failure" in a for a in argv)


def test_an_ecr_image_is_pulled_after_a_login():
    image = "123456789012.dkr.ecr.eu-central-1.amazonaws.com/team/ten-runner:1"
    doc = parse_user_data(render_user_data(**{**BASE, "image": image}))
    pull = next(c for c in doc["runcmd"] if isinstance(c, str) and c.startswith("for "))
    words = shlex.split(pull)
    assert words[words.index("--region") + 1] == "eu-central-1"
    assert "123456789012.dkr.ecr.eu-central-1.amazonaws.com" in words
    plain = parse_user_data(render_user_data(**BASE))
    assert "ecr" not in next(c for c in plain["runcmd"] if isinstance(c, str)
                             and c.startswith("for "))


HOSTILE = [
    "it's", 'say "hi"', "$(touch /tmp/ten-pwned)", "`touch /tmp/ten-pwned`", "a; rm -rf /",
    "line one\nline two", "trailing newline\n", "  spaced  ", "tab\there", "back\\slash\\",
    "$HOME ${HOME} $$", "& | < > ( ) { } [ ] * ? ~ !", "#not a comment", "key: value",
    "- item", "%YAML 1.1", "---", "...", "'; echo '", "\"; echo \"", "é ☃ 漢",
    "line\u2028separator", "next\x85line", "cr\rlf", "bell\x07del\x7f", "{{.Name}}",
]


@pytest.fixture(scope="module")
def fake_docker(tmp_path_factory):
    """A ``docker`` that writes its argv NUL-separated: what the shell really passed."""
    bin_dir = tmp_path_factory.mktemp("fakebin")
    script = bin_dir / "docker"
    script.write_text('#!/bin/sh\nprintf \'%s\\0\' "$@" >> "$FAKE_OUT"\n')
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_values_come_back_exactly(value, fake_docker, tmp_path):
    image, job_url = "img" + value, "s3://b/" + value
    text = render_user_data(image=image, job_url=job_url, job_id=value,
                            env={"TEN_NOTE": value, "AWS_REGION": "us-east-1"})
    doc = parse_user_data(text)  # still #cloud-config with exactly our two keys
    header = text[:text.index("\nwrite_files:")].split("\n")
    assert all(line.startswith("#") for line in header), "a value escaped the comment"
    line = run_line(doc)
    argv = shlex.split(line)
    assert argv[-6:] == [image, "run", job_url, "||", "systemctl", "poweroff"]
    assert f"ten.job-id={value}" in argv and f"TEN_NOTE={value}" in argv
    pull = next(c for c in doc["runcmd"] if isinstance(c, str) and c.startswith("for "))
    assert image in shlex.split(pull)
    # The shell cloud-init uses (sh) gives the container exactly these arguments.
    out = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{fake_docker}:{os.environ['PATH']}", "FAKE_OUT": str(out)}
    done = subprocess.run(["sh", "-c", line], env=env, capture_output=True, timeout=30,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    passed = out.read_bytes().decode().split("\0")[:-1]
    assert passed == argv[1:-3]
    assert not Path("/tmp/ten-pwned").exists()


SECRET_ENV = ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "HF_TOKEN",
              "WANDB_API_KEY", "DB_PASSWORD", "MY_CREDENTIALS", "GITHUB_AUTH"]


@pytest.mark.parametrize("name", SECRET_ENV)
def test_secret_looking_names_are_refused(name):
    with pytest.raises(ProvisionError, match="instance profile") as e:
        render_user_data(**BASE, env={name: "s3cr3t-value-123"})
    assert e.value.exit_code == ExitCode.CONFIG
    assert "s3cr3t" not in e.value.message


REFUSED = [
    ({"env": {"1ABC": "x"}}, "invalid environment variable name"),
    ({"env": {"A-B": "x"}}, "invalid environment variable name"),
    ({"env": {"": "x"}}, "invalid environment variable name"),
    ({"env": {"NOTE": "AKIAIOSFODNN7EXAMPLE"}}, "access key id"),
    ({"env": {"DATABASE_URL": "postgres://u:pw@db/x"}}, "user:password@host"),
    ({"env": {"NOTE": "a\0b"}}, "without NUL"),
    ({"env": {"NOTE": 3}}, "must be a string"),
    ({"job_url": "https://b.s3.amazonaws.com/j.yaml?X-Amz-Signature=abc&X-Amz-Credential=x"},
     "presigned"),
    ({"job_url": "https://user:pw@example.com/j.yaml"}, "user:password@host"),
    ({"job_url": "--rm"}, "must not start with '-'"),
    ({"image": "--privileged"}, "must not start with '-'"),
    ({"image": " "}, "image is empty"),
    ({"job_id": ""}, "job id is empty"),
    ({"job_url": "s3://b/\0"}, "NUL"),
    ({"stop_timeout_s": 0}, "stop timeout"),
    ({"stop_timeout_s": True}, "stop timeout"),
    ({"stop_timeout_s": 110.0}, "stop timeout"),
    ({"max_restarts": -1}, "max restarts"),
    ({"env": {"NOTE": "x" * 20000}}, "EC2 allows 16384"),
]


@pytest.mark.parametrize("change,words", REFUSED, ids=[w for _, w in REFUSED])
def test_refused(change, words):
    with pytest.raises(ProvisionError) as e:
        render_user_data(**{**BASE, **change})
    assert words in e.value.message
    assert "\n" not in e.value.message
    assert "pw@" not in e.value.message and "AKIAIOSFODNN7EXAMPLE" not in e.value.message


def test_the_command_line_reports_errors_in_one_line(capsys):
    code = cloudinit.main([*BASE.values(), "--env", "HF_TOKEN=hf_abcdef"])
    captured = capsys.readouterr()
    assert code == ExitCode.CONFIG and captured.out == ""
    assert captured.err.startswith("Error: HF_TOKEN looks like a secret")
    assert "hf_abcdef" not in captured.err and captured.err.count("\n") == 1


# -- the exit watcher, run by bash against a fake docker event stream ---------------------

FAKE_DOCKER = """#!/bin/bash
echo "docker $*" >> "$FAKE_DIR/log"
if [ "$1" = events ]; then
  n=$(( $(cat "$FAKE_DIR/calls" 2>/dev/null || echo 0) + 1 ))
  echo "$n" > "$FAKE_DIR/calls"
  if [ -f "$FAKE_DIR/events.$n" ]; then cat "$FAKE_DIR/events.$n"; exit 0; fi
  echo idle >> "$FAKE_DIR/log"
  exec "$REAL_SLEEP" 60
fi
"""
FAKE_LOGGER = '#!/bin/bash\necho "$(basename "$0") $*" >> "$FAKE_DIR/log"\n'
T0 = 1_700_000_000_000_000_000  # ns, like docker's TimeNano


def run_watcher(tmp_path, rounds, max_restarts=3, expect_exit=True):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    for name in ("systemctl", "sleep"):  # sleep: no real waiting between reconnects
        (bin_dir / name).write_text(FAKE_LOGGER)
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    for i, events in enumerate(rounds, 1):
        (tmp_path / f"events.{i}").write_text("".join(f"{T0 + t} {code}\n"
                                                      for t, code in events))
    script = tmp_path / "watch-exit"
    script.write_text(watch_script())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
           "REAL_SLEEP": shutil.which("sleep")}
    proc = subprocess.Popen(["bash", str(script), CONTAINER, str(max_restarts), "110"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    log = tmp_path / "log"
    try:
        if expect_exit:
            out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0
        else:  # it keeps watching: wait until it listens for the next round, then stop it
            deadline = time.monotonic() + 30
            while "idle" not in (log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, "the watcher never listened again"
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, log.read_text().splitlines()


@pytest.mark.parametrize("code", [int(c) for c in FINAL_EXIT_CODES])
def test_the_watcher_powers_off_on_a_final_exit(tmp_path, code):
    out, log = run_watcher(tmp_path, [[(1, 1), (2, code)]])
    assert log[-3:] == [f"docker update --restart=no {CONTAINER}",
                        f"docker stop -t 110 {CONTAINER}", "systemctl poweroff"]
    assert f"exited with code {code} (exit 2)" in out


def test_the_watcher_powers_off_once_docker_gives_up(tmp_path):
    out, log = run_watcher(tmp_path, [[(1, 1), (2, 4), (3, 1), (4, 1)]], max_restarts=3)
    assert log[-1] == "systemctl poweroff"
    assert out.count("exited with code") == 4 and "(exit 4)" in out


def test_the_watcher_keeps_watching_restartable_exits(tmp_path):
    """Crashes within the restart budget: no power-off. When the event stream ends
    (dockerd restarted) it listens again from the last exit and ignores a repeat."""
    out, log = run_watcher(tmp_path, [[(1, 1)], [(1, 1), (2, 4)]], max_restarts=3,
                           expect_exit=False)
    assert "systemctl poweroff" not in log
    events = [line for line in log if line.startswith("docker events")]
    assert len(events) == 3
    assert f"--since {T0 // 10**9}" in events[1]
    assert "(exit 2)" in out and "(exit 3)" not in out


def test_the_docker_cli_accepts_the_arguments(tmp_path):
    """The real docker client parses every flag before it talks to a daemon; pointed at
    no daemon at all, it must fail only for want of one."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client installed")
    doc = parse_user_data(render_user_data(**BASE, env={"AWS_REGION": "us-east-1"}))
    argv = shlex.split(run_line(doc))[:-3]
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock",
           "DOCKER_CONFIG": str(tmp_path / "config")}
    commands = [argv, ["docker", "events", "--since", "1", "--filter", f"container={CONTAINER}",
                       "--filter", "event=die", "--format", "{{.TimeNano}}"],
                ["docker", "update", "--restart=no", CONTAINER],
                ["docker", "stop", "-t", "110", CONTAINER]]
    for command in commands:
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0
        assert "Cannot connect to the Docker daemon" in out.stderr, (command, out.stderr)


def test_the_watcher_script_parses():
    out = subprocess.run(["bash", "-n"], input=watch_script(), capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr


def test_yaml_is_plain_safe_yaml():
    """No tags or anchors a different YAML loader could read differently."""
    text = render_user_data(**BASE, env={"NOTE": "&a *a !!python/object"})
    events = list(yaml.parse(text))
    assert not any(isinstance(e, yaml.AliasEvent) for e in events)
    for event in events:
        assert getattr(event, "anchor", None) is None
        tag = getattr(event, "tag", None)
        assert tag is None or tag.startswith("tag:yaml.org,2002:")
    assert yaml.safe_load(text)["runcmd"][-1].count("&a *a !!python/object") == 1
