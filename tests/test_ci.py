""".ci/run, the script CI runs on a clean clone: what it leaves on the machine. Its steps
(python, pip, pytest, buildah) are stand-ins on PATH here; the script is the real one."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

VENV = """#!/bin/sh
# python3 -m venv DIR: a venv whose python answers every step with $PYTHON_STATUS
[ "$1 $2" = "-m venv" ] || exit 99
mkdir -p "$3/bin"
printf '#!/bin/sh\\nexit "${PYTHON_STATUS:-0}"\\n' > "$3/bin/python"
cp "$3/bin/python" "$3/bin/pip"
chmod +x "$3/bin/python" "$3/bin/pip"
printf 'PATH="%s/bin:$PATH"\\n' "$3" > "$3/bin/activate"
"""


def stand_ins(where: Path) -> Path:
    where.mkdir()
    for name, text in {"python3": VENV, "buildah": "#!/bin/sh\n", "debootstrap": "#!/bin/sh\n"
                       }.items():
        (where / name).write_text(text)
        (where / name).chmod(stat.S_IRWXU)
    return where


@pytest.mark.parametrize("status", [0, 3], ids=["passing", "failing"])
def test_ci_removes_its_virtual_environment_however_it_ends(tmp_path, status):
    """Each CI run makes a fresh venv of ~3 GB under TMPDIR; runs on one disk that kept
    theirs filled it, and the next run's pip failed with "No space left on device"."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHON_STATUS": str(status),
           "PATH": f"{stand_ins(tmp_path / 'bin')}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == status, run.stderr
    assert list(tmp.iterdir()) == []
