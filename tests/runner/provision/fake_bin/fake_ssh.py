"""Stand-in for the ssh client. Checks the options ten-runner must pass (BatchMode,
ConnectTimeout, -p, ``--`` before the destination), then does what sshd does with the
command string: runs it with a real shell (``$FAKE_SSH_SHELL -c``) in the sandbox's
"remote home", with a clean environment (ssh forwards none of the caller's), stdin
passed through. Every call is logged to $FAKE_DIR/ssh.jsonl. FAKE_SSH_DOWN: the host is
unreachable; FAKE_SSH_MAX_CALLS: it becomes unreachable after that many calls."""

import json
import os
import subprocess
import sys


def refuse(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(255)


def main() -> None:
    args = sys.argv[1:]
    fake = os.environ["FAKE_DIR"]
    with open(os.path.join(fake, "ssh.jsonl"), "a") as f:
        f.write(json.dumps({"argv": args}) + "\n")
    options, port, i = [], None, 0
    while True:
        if i >= len(args):
            refuse("fake ssh: no '--' before the destination")
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-o", "-p") and i + 1 < len(args):
            if arg == "-o":
                options.append(args[i + 1])
            else:
                port = args[i + 1]
            i += 2
            continue
        refuse(f"fake ssh: unexpected argument {arg!r}")
    rest = args[i:]
    if len(rest) < 2:
        refuse("fake ssh: no destination or no command")
    for needed in ("BatchMode=yes", "ConnectTimeout=10"):
        if needed not in options:
            refuse(f"fake ssh: missing -o {needed}")
    if port != os.environ["FAKE_SSH_PORT"]:
        refuse(f"ssh: connect to host {rest[0]} port {port}: Connection refused")
    if rest[0] != os.environ["FAKE_SSH_DEST"]:
        refuse(f"ssh: Could not resolve hostname {rest[0]}: Name or service not known")
    with open(os.path.join(fake, "ssh.jsonl")) as f:
        calls = sum(1 for _ in f)
    if os.environ.get("FAKE_SSH_DOWN") or calls > int(os.environ.get("FAKE_SSH_MAX_CALLS", calls)):
        refuse("ssh: connect to host gpu-box port 2222: No route to host")
    home = os.environ["FAKE_REMOTE_HOME"]
    env = {"HOME": home, "PATH": os.environ["FAKE_REMOTE_PATH"], "FAKE_DIR": fake,
           "FAKE_FAIL": os.environ.get("FAKE_FAIL", ""), "LC_ALL": "C",
           # the fake docker's script of exit codes, not something ssh forwards
           "FAKE_RUN_EXITS": os.environ.get("FAKE_RUN_EXITS", "")}
    command = " ".join(rest[1:])  # what ssh sends to sshd
    shell = os.environ.get("FAKE_SSH_SHELL", "/bin/bash")
    sys.exit(subprocess.run([shell, "-c", command], cwd=home, env=env).returncode)


main()
