"""The ``ten-runner`` command line.

Thin by design: every command parses its arguments and hands off to a module that
does the work. Heavy imports (torch) happen inside commands, never at import time,
so ``ten-runner --help`` returns in a fraction of a second.
"""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ten-runner")
def cli() -> None:
    """Train Temporal Eigenstate Network language models locally or on rented GPUs."""


@cli.command()
@click.option("--arch", type=click.Choice(["ten", "transformer"]), default="ten",
              show_default=True, help="Model family to list.")
def presets(arch: str) -> None:
    """Print the named model presets with parameter counts and FLOPs per token."""
    from ten.presets import format_preset_table

    click.echo(format_preset_table(arch))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
