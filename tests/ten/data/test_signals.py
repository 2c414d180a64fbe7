"""Loader workers survive the stop signal a whole process group receives (Ctrl-C), so
the trainer can still fetch the batches it needs to finish its step and checkpoint."""

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
