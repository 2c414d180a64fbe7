"""``ten-runner validate`` as the job tests drive it, and what its errors must look like."""

import re

from click.testing import CliRunner

from runner.cli import cli
from runner.exit_codes import ExitCode


def validate(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["validate", *args], env=env)


def assert_one_line_per_error(result, path: str) -> list[str]:
    """Exit CONFIG, no traceback, every error line starts with FILE:LINE or --set."""
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ")
    errors = lines[:-1]
    assert errors
    pattern = re.compile(rf"^({re.escape(path)}:\d+(:\d+)? |{re.escape(path)}: |--set )")
    for line in errors:
        assert pattern.match(line), line
    return errors
