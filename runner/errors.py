"""The one exception type a ``ten-runner`` command raises for a mistake the user can fix.

click prints ``Error: <message>`` (no traceback) and exits with ``exit_code``; commands
pick the code from :class:`runner.exit_codes.ExitCode` so a supervisor knows whether to
retry.
"""

from __future__ import annotations

import click

from runner.exit_codes import ExitCode


class UserError(click.ClickException):
    """A user-fixable problem: one-line message (or one line per problem), no traceback."""

    def __init__(self, message: str, exit_code: int = ExitCode.CONFIG):
        from runner.keys import in_job_terms

        super().__init__(in_job_terms(message))  # the library's field names as job keys
        self.exit_code = int(exit_code)
