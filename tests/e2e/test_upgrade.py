"""An upgrade never strands a run: a run trained by one release resumes under the next,
which adds a model field (issue 46). The next release is this code, copied, with a field
added to TENConfig as a release would add it; the resume runs the copy in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

from patience import communicate
from runhelpers import cli, copy_of_the_code, losses, write_job

NEW_FIELD = '''    future_knob: Annotated[float, Doc("a knob a later release adds")] = 0.0

    def __post_init__(self) -> None:
        check_fields(self)
        self._check_fp8()
        if self.n_eigenstates % self.n_heads:'''


def next_release(where: Path) -> Path:
    """This code with one model field more (at its default, the model computes the same)."""
    copy_of_the_code(where)
    config = where / "ten" / "model" / "config.py"
    text = config.read_text()
    anchor = NEW_FIELD.split("\n", 2)[2]
    assert text.count(anchor) == 1  # TENConfig's checks, which the new field goes above
    config.write_text(text.replace(anchor, NEW_FIELD))
    return where


def test_a_run_from_before_a_model_field_existed_resumes_after_the_upgrade(tmp_path, corpus):
    job = write_job(tmp_path, corpus, name="upgraded", steps=4, every=2)
    _, err = communicate(cli("run", job, "--no-sample"), 300)
    assert "done" in err, err[-2000:]

    code = next_release(tmp_path / "next")
    env = {**os.environ, "PYTHONPATH": str(code)}
    resumed = subprocess.run([sys.executable, "-m", "runner.cli", "run", str(job), "--no-sample",
                              "--set", "train.max_steps=6"],
                             cwd=code, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "predates model field(s) future_knob: resuming with their defaults" \
        in resumed.stderr, resumed.stderr[-3000:]
    assert sorted(losses(tmp_path / "store" / "upgraded")) == [1, 2, 3, 4, 5, 6]
