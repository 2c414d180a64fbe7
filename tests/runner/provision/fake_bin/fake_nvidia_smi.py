"""Stand-in for ``nvidia-smi -L``: one L40S, or (FAKE_FAIL) a broken driver or none."""

import json
import os
import sys

fake = os.environ["FAKE_DIR"]
with open(os.path.join(fake, "nvidia-smi.jsonl"), "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:]}) + "\n")
fail = os.environ.get("FAKE_FAIL", "").split(",")
if "nvidia" in fail:
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.", file=sys.stderr)
    sys.exit(9)
if "nvidia-none" in fail:
    print("No devices were found")
    sys.exit(6)
if sys.argv[1:] != ["-L"]:
    sys.exit(2)
print("GPU 0: NVIDIA L40S (UUID: GPU-3f2c1a9e-0000-4b5e-9c1d-7a0f6e2b8c11)")
