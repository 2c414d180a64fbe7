"""A cloud declares itself (runner/job/clouds/): its module alone gives the job its
``resources.<cloud>`` section, ``submit --to`` its form and help, and the destinations
its module. Checked on a copy of this code with one module added, as a new cloud adds
it, in fresh interpreters (the schema is built when it is imported)."""

import subprocess
import sys
from pathlib import Path

import pytest
from runhelpers import MINIMAL_JOB, copy_of_the_code

from runner.job.clouds import CLOUDS, forms

NEW_CLOUD = '''"""A cloud a test adds."""

from pydantic import Field

from runner.job.clouds import Cloud
from runner.job.fields import Section, Str


class ThunderSection(Section):
    """What --to thunder asks for."""

    flavor: Str = Field("gpu-1x", description="the machine's flavor")


CLOUD = Cloud("thunder", form="thunder", summary="a test's GPU cloud",
              destination="runner.provision.local", section=ThunderSection)
'''


def with_a_new_cloud(where: Path) -> Path:
    copy_of_the_code(where)
    (where / "runner" / "job" / "clouds" / "thunder.py").write_text(NEW_CLOUD)
    return where


def run(code: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=code, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin",
                                            "HOME": str(code)})


def test_the_clouds_here_are_local_aws_and_ssh_in_that_order():
    assert [c.name for c in CLOUDS] == ["local", "aws", "ssh"]
    assert forms() == "local, aws or ssh://user@host[:port]"


@pytest.mark.slow  # CLI processes on a copy of the code
def test_a_new_clouds_module_alone_gives_its_section_help_and_destination(tmp_path):
    code = with_a_new_cloud(tmp_path / "code")
    (code / "job.yaml").write_text(MINIMAL_JOB + "resources: {thunder: {flavor: gpu-8x}}\n")
    (code / "typo.yaml").write_text(MINIMAL_JOB + "resources: {thunder: {flavour: gpu-8x}}\n")

    ok = run(code, "-m", "runner.cli", "validate", "--no-path-checks", "job.yaml")
    assert ok.returncode == 0, ok.stderr[-2000:]
    typo = run(code, "-m", "runner.cli", "validate", "--no-path-checks", "typo.yaml")
    assert typo.returncode == 2 and "resources.thunder.flavour" in typo.stderr, typo.stderr
    helped = run(code, "-m", "runner.cli", "submit", "--help")
    assert "local|aws|ssh://user@host[:port]|thunder" in helped.stdout
    assert "thunder: a test's GPU cloud" in " ".join(helped.stdout.split())
    served = run(code, "-c", "from runner.provision.destinations import FORMS, destination;"
                             "print(type(destination('thunder')).__module__, '/', FORMS)")
    assert served.stdout.split() == ["runner.provision.local", "/", "local,", "aws,", "ssh://"
                                     "user@host[:port]", "or", "thunder"], served.stderr
