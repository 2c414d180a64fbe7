"""Loader workers and the trainer's end: they survive the stop signal a whole process
group receives (Ctrl-C), so the trainer can still fetch the batches it needs to finish
its step and checkpoint, and they stay quiet when the trainer is killed mid-handover."""

import json
import subprocess
import sys
import textwrap

import pytest

from ten.data import DataConfig, TokenizerConfig, open_data

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from ten.data import DataConfig, open_data
    from ten.data import TokenizerConfig
    fields = json.loads(sys.argv[1])
    cfg = DataConfig(**fields, tokenizer=TokenizerConfig(vocab_size=300))
    seen = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))  # the trainer
    loader = open_data(cfg).train_loader(batch_size=2, num_workers=2)

    def ctrl_c_storm():  # Ctrl-C to every process of the group, workers starting or not
        for _ in range(200):
            os.killpg(os.getpgid(0), signal.SIGINT)
            time.sleep(0.005)

    storm = threading.Thread(target=ctrl_c_storm)
    storm.start()
    batches = iter(loader)
    for _ in range(300):  # far beyond what the workers had prefetched
        next(batches)
    storm.join()
    print("ok", len(seen) > 0)
""")


@pytest.mark.parametrize("mode", ["pretokenized", "streaming"])
def test_workers_ignore_group_sigint(tmp_path, corpus, mode):
    fields = dict(dataset=str(corpus), mode=mode, seq_len=16,
                  cache_dir=str(tmp_path / "cache"), num_proc=1, progress=False)
    # prepare outside the signalled process
    open_data(DataConfig(**fields, tokenizer=TokenizerConfig(vocab_size=300)))
    p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(fields)], capture_output=True,
                       text=True, timeout=120, start_new_session=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "ok True"


# A batch's storage crosses from a worker by file descriptor: the trainer connects to the
# worker's resource sharer. This one hangs up without reading the sharer's greeting, as a
# trainer killed in the handshake does, then fetches a descriptor properly: served in
# turn, so the hang-up was handled before "served" is printed.
HANG_UP = textwrap.dedent("""
    import os, select, socket, sys
    from multiprocessing import resource_sharer
    from ten.data.loader import init_worker
    if sys.argv[1] == "worker":
        init_worker(0)
    shared = resource_sharer.DupFd(os.open(os.devnull, os.O_RDONLY))
    trainer = socket.socket(socket.AF_UNIX)
    address, _ = shared._id  # the sharer's socket, and this descriptor's key there
    trainer.connect(address)
    select.select([trainer], [], [])  # the greeting has come
    trainer.close()  # unread: the sharer's next read is reset
    os.close(shared.detach())
    print("served")
""")


@pytest.mark.parametrize("process", ["worker", "plain"])
def test_a_worker_is_silent_when_the_trainer_hangs_up_mid_handover(process):
    p = subprocess.run([sys.executable, "-c", HANG_UP, process], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "served\n", p.stderr[-2000:]
    if process == "worker":
        assert p.stderr == ""
    else:  # what a worker printed before: the reset, reported by the sharer's thread
        assert "Traceback" in p.stderr and "ConnectionResetError" in p.stderr
