"""DiffusionGemmaForBlockDiffusion.save_pretrained (model.py) through `atomic_folder`: no stale weight set survives a
re-save in another layout, a file path is an error, overwrite=False refuses, and a real SIGINT while saving leaves
the complete old or the complete new checkpoint."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion as Model
from diffusiongemma.loading.compressed import check_weight_files

ROOT = Path(__file__).resolve().parents[2]


def same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def models():
    return tiny_model(seed=1), tiny_model(seed=2)


def test_sharded_over_single_and_back(tmp_path, models):
    old, new = models
    old.save_pretrained(tmp_path)
    new.save_pretrained(tmp_path, max_shard_size="100KB")
    assert not (tmp_path / "model.safetensors").exists()
    check_weight_files(str(tmp_path))
    assert same(Model.from_pretrained(tmp_path), new)
    old.save_pretrained(tmp_path)
    assert not (tmp_path / "model.safetensors.index.json").exists() and not list(tmp_path.glob("model-*"))
    assert same(Model.from_pretrained(tmp_path), old)


def test_refusals_and_kept_files(tmp_path, models):
    old, new = models
    (tmp_path / "tokenizer.json").write_text("{}")
    old.save_pretrained(tmp_path)  # a folder holding only a tokenizer is not a checkpoint
    with pytest.raises(FileExistsError, match="already holds a checkpoint"):
        new.save_pretrained(tmp_path, overwrite=False)
    assert same(Model.from_pretrained(tmp_path), old) and (tmp_path / "tokenizer.json").exists()
    (tmp_path / "file.bin").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        new.save_pretrained(tmp_path / "file.bin")


def test_exception_mid_save_keeps_the_old(tmp_path, models, monkeypatch):
    old, new = models
    old.save_pretrained(tmp_path)
    import transformers.modeling_utils
    calls = []

    def broken(*args, **kwargs):  # the third shard fails
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(*args, **kwargs)
    real = transformers.modeling_utils.safe_save_file
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        new.save_pretrained(tmp_path, max_shard_size="100KB")
    monkeypatch.undo()
    assert same(Model.from_pretrained(tmp_path), old)
    assert [p.name for p in tmp_path.parent.iterdir() if p.name.startswith(f".{tmp_path.name}.")] == []


SAVER = textwrap.dedent("""
    import sys
    import signal
    # Ctrl-C raises KeyboardInterrupt here even when the test runner was started with SIGINT ignored (a
    # background job of a non-interactive shell): children inherit that, and Python then installs no handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, sys.argv[2])
    from conftest import tiny_model
    model = tiny_model(seed=2)
    print("ready", flush=True)
    while True:
        model.save_pretrained(sys.argv[1], max_shard_size="50KB")
""")


def test_sigint_while_saving(tmp_path, models):
    old, new = models
    old.save_pretrained(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path), str(ROOT / "tests")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode != 0 and "KeyboardInterrupt" in err
    check_weight_files(str(tmp_path))
    loaded = Model.from_pretrained(tmp_path)
    assert same(loaded, old) or same(loaded, new)
