"""The image a spot VM pulls and starts: its size layer by layer, what in it a run loads,
and the time from ``docker run`` to the first training step. Built and run without a
daemon as the image check does (tests/support/oci.py: buildah, a Debian base standing in
for the CUDA one, which weighs ~0.2 GB more on a real host).

    python benchmarks/bench_image.py                 # cached layers reused
    python benchmarks/bench_image.py --cold          # every image removed first: debootstrap
                                                     # and a full build
    python benchmarks/bench_image.py --json out.json

1. Build time (cached layers, or with ``--cold`` from nothing: the base from the Debian
   archive, then every layer; the packages downloaded from their indexes).
2. Each layer's unpacked size, and the image's total.
3. site-packages by distribution, largest first, with whether a run of the default job
   imports it (``sys.modules`` at the end of an in-process run, CPU). A package no run
   imports is a cost every pull pays for nothing; the CUDA libraries are loaded by torch
   on a GPU only, so "no" for them means "not on a CPU".
4. Start to first step, the default job at its first step, in a fresh container: on a
   new volume (cold: the builtin corpus tokenized, the shards written) and on the volume
   the previous container left (warm: the prepared data reused). Each the median of
   ``--repeats``. On a GPU the Triton cache on the volume matters too; not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

import oci  # noqa: E402 - the image check's own builder and container

GB = 1e9

# In the container: the packages of site-packages with their sizes, and those a run of
# the default job (in this process, to its first checkpoint) has imported at its end.
LOADED = r"""
import json, sys, importlib.metadata as md
from pathlib import Path
from click.testing import CliRunner
from runner.cli import cli
result = CliRunner().invoke(cli, ["run", "jobs/tiny-cpu.yaml", "--no-sample", "--set",
                                  "train.max_steps=2", "--set", "storage.url=/tmp/runs"])
assert result.exit_code == 0, result.output
loaded = {name.split(".")[0] for name in sys.modules}
out = []
for dist in md.distributions():
    files = dist.files or []
    size = sum((dist.locate_file(f).stat().st_size for f in files
                if dist.locate_file(f).is_file()), 0)
    tops = (dist.read_text("top_level.txt") or "").split() or sorted(
        {str(f).split("/")[0].removesuffix(".py") for f in files if "/" in str(f)
         and not str(f).split("/")[0].endswith((".dist-info", ".data"))})
    out.append({"name": dist.metadata["Name"], "bytes": size,
                "imported": any(t in loaded for t in tops)})
print(json.dumps(out))
"""


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def first_step(volume: Path) -> tuple[float, float]:
    """(seconds from the container's start to its "first step done" line, the trainer's
    own first-step time) for the default job in a fresh container on ``volume``."""
    box = oci.Container(volume)
    try:
        t0 = time.perf_counter()
        proc = box.start("run", "jobs/tiny-cpu.yaml", "--no-sample", "--set",
                         "train.max_steps=2", "--set", f"storage.url=/tmp/runs-{t0}")
        for line in proc.stderr:
            m = re.search(r"first step done in ([\d.]+) s", line)
            if m:
                wall = time.perf_counter() - t0
                box.kill(proc)
                return wall, float(m[1])
        raise RuntimeError(f"no first step: exit {proc.wait()}")
    finally:
        box.remove()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold", action="store_true",
                    help="remove every image and layer first, the base too")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    why = oci.missing()
    if why:
        sys.exit(f"bench_image: {why}")
    if args.cold:  # every image and cached layer of this machine's store, the base too
        subprocess.run(["buildah", "rm", "--all"], capture_output=True)
        subprocess.run(["buildah", "rmi", "--all", "--force"], capture_output=True)
    say("building")
    t0 = time.perf_counter()
    oci.build()  # its own figure leaves the base out; a cold start has to make it too
    build_s = time.perf_counter() - t0
    layers = oci.layers()
    say("what a run loads")
    box = oci.Container(Path(tempfile.mkdtemp()) / "cache")
    try:
        out = box.exec("python", "-c", LOADED, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        packages = sorted(json.loads(out.stdout.strip().splitlines()[-1]),
                          key=lambda p: -p["bytes"])
    finally:
        box.remove()
    cold, warm = [], []
    for i in range(args.repeats):
        volume = Path(tempfile.mkdtemp()) / "cache"
        say(f"start to first step {i + 1}/{args.repeats}")
        cold.append(first_step(volume))
        warm.append(first_step(volume))
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, CPU",
        "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
        "build_s": round(build_s, 1), "cold_build": args.cold,
        "image_gb": round(sum(size for _, size in layers) / GB, 3),
        "layers": [{"by": by, "gb": round(size / GB, 3)} for by, size in layers],
        "packages": [{**p, "gb": round(p.pop("bytes") / GB, 3)} for p in packages[:25]],
        "first_step_s": {
            kind: {"wall_median": round(statistics.median(w for w, _ in runs), 2),
                   "step_median": round(statistics.median(s for _, s in runs), 2),
                   "wall": [round(w, 2) for w, _ in runs]}
            for kind, runs in (("cold_volume", cold), ("warm_volume", warm))},
    }
    print(f"build {result['build_s']} s ({'cold' if args.cold else 'cached layers'}), "
          f"image {result['image_gb']} GB")
    for layer in result["layers"]:
        print(f"  {layer['gb']:7.3f} GB  {layer['by']}")
    print("site-packages, largest (imported by a CPU run of the default job?)")
    for p in result["packages"][:15]:
        print(f"  {p['gb']:7.3f} GB  {p['name']:<28} {'yes' if p['imported'] else 'no'}")
    for kind, r in result["first_step_s"].items():
        print(f"start -> first step, {kind}: {r['wall_median']} s (runs {r['wall']}; the "
              f"step itself {r['step_median']} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
