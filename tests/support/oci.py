"""The project's image, built from its Dockerfile and run as ``docker run`` runs it, on a
machine without a Docker daemon or a reachable registry: buildah with chroot isolation,
and a base image made from the Debian archive with debootstrap standing in for the CUDA
one (the Dockerfile's ``BASE_IMAGE`` build argument). Used by tests/image/ and
benchmarks/bench_image.py.

What stands in for what ``docker run -v ten-cache:/cache IMAGE ARGS`` does:

* the image's ENTRYPOINT is prepended to ARGS (buildah run does not apply it);
* the image's ``VOLUME /cache`` is dropped from the working container, so the host folder
  given is what the run sees at /cache (buildah would mount a fresh anonymous volume over
  it); the folder is owned by the image's uid, as cloud-init chowns the host cache;
* tini is not PID 1 without a PID namespace (chroot isolation makes none): it runs as a
  child subreaper (``TINI_SUBREAPER``) and the signals ``docker stop`` sends to PID 1 go
  to the tini process (:meth:`Container.tini`);
* the host's network is shared, so servers on 127.0.0.1 are reachable from inside.

Where the package index is reached through a TLS-intercepting proxy, its CA is in the
host's system bundle: the build's RUN steps see it through a read-only mount and a pip
configuration naming it, both mounts, never a layer of the image.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

from runner.provision.cloudinit import IMAGE_UID  # the Dockerfile's USER (test_dockerfile)

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/ten-check-base:bookworm"
IMAGE = "localhost/ten-runner:check"
MIRROR = "http://deb.debian.org/debian"
LOCK = Path(tempfile.gettempdir()) / "ten-image-check.lock"


def missing() -> str | None:
    """Why the image cannot be built and run here, or None."""
    if os.geteuid() != 0:
        return "needs root (buildah with chroot isolation, debootstrap)"
    absent = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if absent:
        return f"needs {' and '.join(absent)} (apt-get install buildah debootstrap)"
    return None


def _run(*cmd: str, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exited {out.returncode}: "
                           f"{(out.stderr or out.stdout)[-3000:]}")
    return out


def _exists(image: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", image],
                          capture_output=True).returncode == 0


def base_image() -> str:
    """A minimal Debian 12 image from the archive (made once, then kept)."""
    if _exists(BASE):
        return BASE
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), MIRROR)
        ctr = _run("buildah", "from", "scratch").stdout.strip()
        try:
            mount = _run("buildah", "mount", ctr).stdout.strip()
            _run("cp", "-a", f"{rootfs}/.", mount)
            _run("buildah", "umount", ctr)
            _run("buildah", "commit", "--format", "docker", "-q", ctr, BASE)
        finally:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
    return BASE


def build(tag: str = IMAGE) -> float:
    """Build the Dockerfile as it stands on :func:`base_image` (cached layers reused);
    the seconds it took. One build at a time on this machine (a file lock)."""
    import filelock

    with filelock.FileLock(str(LOCK)):
        base = base_image()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            cafile = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
            pip_conf = Path(tmp) / "pip.conf"
            pip_conf.write_text("[global]\ncert = /run/host-ca.crt\n")
            _run("buildah", "bud", "--format", "docker", "--isolation", "chroot", "--layers",
                 "-q", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
                 "--build-arg", f"BASE_IMAGE={base}",
                 "-v", f"{cafile}:/run/host-ca.crt:ro", "-v", f"{pip_conf}:/etc/pip.conf:ro",
                 "-t", tag, str(ROOT), timeout=3600)
        return time.perf_counter() - t0


def config(image: str = IMAGE) -> dict:
    """The image's Docker config (Entrypoint, User, Env, Healthcheck, Volumes...)."""
    out = _run("buildah", "inspect", "--type", "image", image).stdout
    return json.loads(out)["Docker"]["config"]


def layers(image: str = IMAGE) -> list[tuple[str, int]]:
    """(the instruction that made it, bytes unpacked) for each layer that holds files,
    base first."""
    info = json.loads(_run("buildah", "inspect", "--type", "image", image).stdout)
    history = [h for h in info["Docker"]["history"] if not h.get("empty_layer")]
    store = json.loads(_run("buildah", "info").stdout)["store"]["GraphRoot"]
    sizes = _layer_sizes(Path(store), info["Docker"]["rootfs"]["diff_ids"])
    return [(_instruction(h.get("created_by", "")), size) for h, size in
            zip(history, sizes, strict=True)]


def _instruction(created_by: str) -> str:
    """A layer's Dockerfile line, shortened: "RUN apt-get update ...", "COPY dir ... ten"."""
    text = " ".join(created_by.split())
    for shell in ("/bin/sh -c #(nop) ", "/bin/sh -c "):  # after buildah's "|N ARG=..."
        if shell in text:
            text = text.split(shell, 1)[1]
            break
    if text.startswith("COPY"):
        return "COPY " + text.rsplit(" in ", 1)[-1].strip()
    return text[:90]


def _layer_sizes(graph_root: Path, diff_ids: list[str]) -> list[int]:
    """Unpacked sizes from the store's own layer records (overlay driver)."""
    records = json.loads((graph_root / "overlay-layers" / "layers.json").read_text())
    by_diff = {r.get("diff-digest"): r.get("diff-size", 0) for r in records}
    return [int(by_diff.get(d, 0)) for d in diff_ids]


class Container:
    """One container of the image with a host folder as its /cache volume."""

    def __init__(self, cache: Path, image: str = IMAGE) -> None:
        self.cache = Path(cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        os.chown(self.cache, IMAGE_UID, IMAGE_UID)
        self.entrypoint = config(image)["Entrypoint"]
        self.name = _run("buildah", "from", "--pull-never", image).stdout.strip()
        _run("buildah", "config", "--volume", "/cache-", self.name)  # the host folder wins

    def _cmd(self, argv: list[str], env: dict[str, str]) -> list[str]:
        flags = ["--isolation", "chroot", "-v", f"{self.cache}:/cache",
                 "--env", "TINI_SUBREAPER=1"]
        for name, value in env.items():
            flags += ["--env", f"{name}={value}"]
        return ["buildah", "run", *flags, self.name, "--", *argv]

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``docker run IMAGE ARGS``: the entrypoint with ``args``, in the background."""
        return subprocess.Popen(self._cmd([*self.entrypoint, *args], env or {}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def exec(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``docker exec``: another process in the same container, as the image's user."""
        return subprocess.run(self._cmd(list(argv), {}), capture_output=True, text=True,
                              timeout=timeout)

    def tini(self, proc: subprocess.Popen) -> int:
        """The pid of the tini that ``proc`` (from :meth:`start`) runs: the container's
        PID 1 under Docker, where ``docker stop`` and a spot reclaim send SIGTERM."""
        for pid in _descendants(proc.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "tini":
                    return pid
            except OSError:
                continue
        raise AssertionError(f"no tini under {proc.pid}")

    def kill(self, proc: subprocess.Popen) -> None:
        """kill -9 of the container's processes (``docker kill``), then of ``proc``:
        killing buildah run alone would leave the run going."""
        for pid in reversed(_descendants(proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.communicate()

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
