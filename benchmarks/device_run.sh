#!/usr/bin/env bash
# There, on the lent GPU machine (the device tool's run, with carry [".devsite"]): the GPU
# suite into $OUT, from the checkout as it arrived (nothing installed).
#
#   bash benchmarks/device_run.sh                 # e2e and the open issues' sections first,
#                                                 # then the rest of parts 1-4, in 540 s
#   bash benchmarks/device_run.sh --part 1        # or parts 1-4 on a slower card; 5: recall;
#                                                 # 6: the matrix state (issue 47);
#                                                 # 7: float8 GEMMs (issue 48)
#
# Any gpu_suite.py arguments pass through (--sections ..., --smoke). TEN_DEVSITE names
# the bundle folder (default .devsite, made by benchmarks/device_bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
site=${TEN_DEVSITE:-$PWD/.devsite}
if [[ ! -d "$site" ]]; then
    echo "device_run: no $site: run 'bash benchmarks/device_bundle.sh' here and carry .devsite" >&2
    exit 2
fi
export TEN_DEVSITE="$site"
# The e2e section's S3 server (benchmarks/gpu_e2e.py unpacks it).
if [[ -f "$site/rclone.xz" ]]; then
    export TEN_E2E_RCLONE="$site/rclone.xz"
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# One line naming what is missing, before any minute is spent.
python3 - <<'PY'
import importlib, sys
missing = []
for name in ("torch", "triton", "pydantic", "bitsandbytes", "yaml", "click", "sentencepiece",
             "pynvml", "boto3", "ten.train.trainer", "runner.cli", "runner.storage.s3"):
    try:
        importlib.import_module(name)
    except Exception as e:  # ImportError, or a library failing to load
        missing.append(f"{name} ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
if missing:
    sys.exit("device_run: cannot import " + "; ".join(missing)
             + ": rebuild the bundle (benchmarks/device_bundle.sh) and carry .devsite")
PY
exec python3 benchmarks/gpu_suite.py --out "${OUT:?set OUT to the folder that comes back}" "$@"
