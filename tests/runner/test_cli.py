import subprocess
import sys

from click.testing import CliRunner

from runner.cli import cli


def test_help_is_fast_and_lists_commands():
    out = subprocess.run([sys.executable, "-m", "runner.cli", "--help"], capture_output=True,
                         text=True, check=True, timeout=30)
    assert "presets" in out.stdout


def test_presets_command_prints_table():
    result = CliRunner().invoke(cli, ["presets"])
    assert result.exit_code == 0, result.output
    assert "small_32k" in result.output and "FLOPs/token" in result.output
    result = CliRunner().invoke(cli, ["presets", "--arch", "transformer"])
    assert result.exit_code == 0 and "large" in result.output
