
import pytest
from click.testing import CliRunner

from runner.cli import cli


def test_presets_command_prints_table():
    result = CliRunner().invoke(cli, ["presets"])
    assert result.exit_code == 0, result.output
    assert "small_32k" in result.output and "FLOPs/token" in result.output
    result = CliRunner().invoke(cli, ["presets", "--arch", "transformer"])
    assert result.exit_code == 0 and "large" in result.output


@pytest.mark.slow  # a fresh process with torch
def test_the_exit_skips_collecting_the_heap_torch_left():
    """Python's exit collects every object still alive: after torch and torch._dynamo
    (which the optimizer imports) ~0.8 s of a 2-core machine's time per command, for
    objects the process frees anyway. ``main`` freezes them out of that last collection
    (gc.freeze); atexit handlers still run, and run after it."""
    import subprocess
    import sys

    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            "sys.argv = ['ten-runner', 'presets']\n"
            "from runner.cli import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "small_32k" in proc.stdout and proc.stdout.rstrip().endswith("frozen True")
