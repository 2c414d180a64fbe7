#!/usr/bin/env bash
# Rehearse the device recipe on this CPU machine, end to end, before a GPU session needs it:
#
#   bash benchmarks/device_rehearsal.sh
#
# 1. A venv with the lent image's package set (the device tool's KINDS.md) and none of
#    ours: Triton 3.6.0 (the image's), torch 2.13.0 CPU (the image has torch 2.11 CUDA and
#    CPython 3.12; this machine installs only the 2.13.0 CPU wheel, for CPython 3.11),
#    numpy, click, pyyaml, sentencepiece, tensorboard, tqdm, matplotlib, nvidia-ml-py,
#    pytest, python-dateutil. No pydantic, boto3, bitsandbytes, datasets, liger-kernel,
#    moto, rclone (the bundle brings what the device lacks). Kept in
#    $REHEARSAL_VENV (default /tmp/ten-device-venv) and reused.
# 2. The bundle, built by device_bundle.sh as for the device (its CPython 3.12 size is
#    what travels), and again for this venv's Python.
# 3. device_run.sh --smoke --part N for every part, the checkout on PYTHONPATH only, each
#    into its own $OUT, timed; then --merge.
# Exits 0 only when every section of every part completed without an error.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${REHEARSAL_VENV:-/tmp/ten-device-venv}
work=$(mktemp -d /tmp/ten-rehearsal-XXXX)
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

if [[ ! -x "$venv/bin/python" ]]; then
    echo "rehearsal: building $venv"
    python3.11 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch==2.13.0
    "$venv/bin/pip" install --quiet --no-deps triton==3.6.0  # the image's, over torch's pin
    "$venv/bin/pip" install --quiet numpy click pyyaml sentencepiece tensorboard tqdm \
        matplotlib nvidia-ml-py pytest packaging urllib3 python-dateutil
fi
for pkg in pydantic boto3 bitsandbytes datasets liger_kernel moto ten runner; do
    if (cd / && PYTHONPATH= "$venv/bin/python" -c "import $pkg" 2>/dev/null); then
        echo "rehearsal: $venv has $pkg, which the lent image lacks: remove the venv" >&2
        exit 1
    fi
done

bash benchmarks/device_bundle.sh 3.12 "$work/site312"  # what travels (size checked there)
bash benchmarks/device_bundle.sh "$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" "$work/site"

status=0
parts=$(PYTHONPATH=benchmarks "$venv/bin/python" -c 'import gpu_suite; print(*gpu_suite.PARTS)')
for part in $parts; do
    mkdir -p "$work/out$part"
    start=$SECONDS
    if ! PATH="$venv/bin:$PATH" PYTHONPATH= TEN_DEVSITE="$work/site" OUT="$work/out$part" \
        bash benchmarks/device_run.sh --smoke --part "$part"; then
        status=1
    fi
    echo "rehearsal: part $part took $((SECONDS - start)) s (a device call allows 600)"
done
"$venv/bin/python" benchmarks/gpu_suite.py --merge "$work"/out*/cpu-*-part*.json \
    --out "$work/merged" >/dev/null || status=1
echo "rehearsal: results in $work/merged; exit $status"
exit $status
