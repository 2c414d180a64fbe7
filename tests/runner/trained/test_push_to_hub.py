"""``export-model --push-to-hub``: a repository id or a token that cannot work is one
line before anything is exported (nothing written)."""

from __future__ import annotations

from click.testing import CliRunner

from runner.cli import cli
from runner.exit_codes import ExitCode


def export(tmp_path, *args, env):
    return CliRunner().invoke(cli, ["export-model", str(tmp_path / "no-such-run"), "--out",
                                    str(tmp_path / "out"), *args], env=env)


def test_a_repository_id_that_is_not_one_is_refused_before_exporting(tmp_path):
    result = export(tmp_path, "--push-to-hub", "me/bad name!", env={"HF_TOKEN": "hf_x"})
    assert result.exit_code == ExitCode.CONFIG
    assert result.output.count("\n") == 1 and "is not a Hub repository id" in result.output
    assert not (tmp_path / "out").exists()


def test_no_token_is_refused_before_exporting(tmp_path):
    result = export(tmp_path, "--push-to-hub", "me/tiny-ten", env={"HF_TOKEN": ""})
    assert result.exit_code == ExitCode.CLOUD_CREDENTIALS
    assert result.output.count("\n") == 1 and "needs HF_TOKEN" in result.output
    assert not (tmp_path / "out").exists()
