"""Stand-in for the docker CLI: enough of info, run, inspect, logs, stop and rm to drive
ten-runner, with containers kept as JSON files under $FAKE_DIR/containers. ``run``
records, at the moment it runs, the env file's mode and content (it is removed after)
and the mode of the job file (the image's user is not the file's owner).
Every call is logged to $FAKE_DIR/docker.jsonl. FAKE_FAIL (comma separated):
docker-info (daemon down), docker-run-gpu (no GPU runtime), docker-run-image (no image).
FAKE_RUN_EXITS (comma separated exit codes): the n-th ``run`` starts a container that has
already exited with the n-th code (runs past the list stay running)."""

import json
import os
import stat
import sys

FAKE = os.environ["FAKE_DIR"]
FAIL = os.environ.get("FAKE_FAIL", "").split(",")
CONTAINERS = os.path.join(FAKE, "containers")
RUN_VALUE_OPTIONS = {"--name", "--gpus", "--restart", "--stop-timeout", "--shm-size",
                     "--env-file", "-e", "-v"}


def log(**entry):
    with open(os.path.join(FAKE, "docker.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")


def die(message, code=1):
    print(message, file=sys.stderr)
    sys.exit(code)


def state_path(name):
    return os.path.join(CONTAINERS, name + ".json")


def load(name):
    try:
        with open(state_path(name)) as f:
            return json.load(f)
    except FileNotFoundError:
        die(f"Error response from daemon: No such container: {name}")


def save(name, state):
    os.makedirs(CONTAINERS, exist_ok=True)
    with open(state_path(name), "w") as f:
        json.dump(state, f)


def run(args):
    options, i = {}, 0
    while args[i].startswith("-"):
        if args[i] in RUN_VALUE_OPTIONS:
            options.setdefault(args[i], []).append(args[i + 1])
            i += 2
        elif args[i] == "-d":
            i += 1
        else:
            die(f"unknown flag: {args[i]}", 125)
    image, command = args[i], args[i + 1:]
    env_file = options["--env-file"][0]
    st = os.stat(env_file)
    with open(env_file) as f:
        env_text = f.read()
    mounts = {}
    for spec in options.get("-v", []):
        source, target = spec.split(":", 1)
        if source.startswith("/") and not os.path.exists(source):  # else a named volume
            die(f"docker: Error response from daemon: invalid mount source {source}", 125)
        mounts[target] = source
    job = mounts.get("/job/job.yaml:ro")
    log(argv=sys.argv[1:], env_file_mode=stat.S_IMODE(st.st_mode), env_file=env_text,
        job_yaml_mode=stat.S_IMODE(os.stat(job).st_mode) if job else None)
    name = options["--name"][0]
    if os.path.exists(state_path(name)):
        die(f'docker: Error response from daemon: Conflict. The container name "/{name}" '
            "is already in use.", 125)
    if "docker-run-gpu" in FAIL or "docker-run-image" in FAIL:
        save(name, {"status": "created", "exit_code": 0, "restarts": 0})
        if "docker-run-gpu" in FAIL:
            die('docker: Error response from daemon: could not select device driver "" with '
                "capabilities: [[gpu]].", 125)
        die(f"docker: Error response from daemon: pull access denied for {image}, repository "
            "does not exist or may require 'docker login'.", 125)
    exits = [c for c in os.environ.get("FAKE_RUN_EXITS", "").split(",") if c]
    runs = sum(1 for line in open(os.path.join(FAKE, "docker.jsonl"))
               if json.loads(line)["argv"][0] == "run")
    status, code = ("exited", int(exits[runs - 1])) if runs <= len(exits) else ("running", 0)
    save(name, {"status": status, "exit_code": code, "restarts": 0, "image": image,
                "command": command})
    print("4f" * 32)


def inspect(args):
    fmt = args[args.index("--format") + 1]
    name = args[-1]
    if not os.path.exists(state_path(name)):
        die(f"Error: No such object: {name}")
    state = load(name)
    for token, value in (("{{.State.Status}}", state["status"]),
                         ("{{.State.ExitCode}}", state["exit_code"]),
                         ("{{.RestartCount}}", state["restarts"]),
                         ("{{.State.OOMKilled}}", state.get("oom_killed", False))):
        fmt = fmt.replace(token, str(value).lower() if isinstance(value, bool) else str(value))
    if "{{" in fmt:
        die(f"template: the fake understands no more of {fmt!r}")
    print(fmt)


def logs(args):
    name = args[-1]
    load(name)
    path = os.path.join(CONTAINERS, name + ".log")
    lines = open(path).read().splitlines(keepends=True) if os.path.exists(path) else []
    if "--tail" in args:
        n = int(args[args.index("--tail") + 1])
        lines = lines[len(lines) - n:] if n else []
    sys.stdout.write("".join(lines))


def main():
    args = sys.argv[1:]
    if args[:1] != ["run"]:
        log(argv=args)
    if not args:
        die("usage: docker COMMAND", 2)
    command, rest = args[0], args[1:]
    if command == "info":
        if "docker-info" in FAIL:
            die("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the "
                "docker daemon running?")
        print("27.3.1")
    elif command == "run":
        run(rest)
    elif command == "inspect":
        inspect(rest)
    elif command == "logs":
        logs(rest)
    elif command == "stop":
        name = rest[-1]
        state = load(name)
        if state["status"] in ("running", "restarting"):
            state.update(status="exited", exit_code=75)  # the runner checkpointed and left
            save(name, state)
        print(name)
    elif command == "rm":
        name = rest[-1]
        state = load(name)
        if state["status"] == "running" and "-f" not in rest:
            die(f"Error response from daemon: cannot remove container {name}: container is "
                "running: stop the container before removing or force remove")
        os.remove(state_path(name))
        print(name)
    else:
        die(f"docker: unknown command {command!r}", 2)


main()
