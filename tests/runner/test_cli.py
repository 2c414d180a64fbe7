
from click.testing import CliRunner

from runner.cli import cli


def test_presets_command_prints_table():
    result = CliRunner().invoke(cli, ["presets"])
    assert result.exit_code == 0, result.output
    assert "small_32k" in result.output and "FLOPs/token" in result.output
    result = CliRunner().invoke(cli, ["presets", "--arch", "transformer"])
    assert result.exit_code == 0 and "large" in result.output
