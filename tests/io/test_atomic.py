"""diffusiongemma/io/atomic.py `atomic_folder`: a destination is only ever the complete old or the complete new
checkpoint, whether the write finishes, raises mid-way, or is interrupted by a real SIGINT; nothing stale survives an
overwrite; a destination holding a checkpoint is refused without overwrite."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from diffusiongemma.io.atomic import atomic_folder, holds_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def listing(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def old_checkpoint(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("old config")
    (folder / "model.safetensors.index.json").write_text("old index")
    for i in (1, 2):
        (folder / f"model-0000{i}-of-00002.safetensors").write_text(f"old shard {i}")
    (folder / "tokenizer.json").write_text("tokenizer")
    (folder / "logs").mkdir()
    (folder / "logs" / "train.jsonl").write_text("log")


def test_new_folder(tmp_path):
    dst = tmp_path / "a" / "b"
    with atomic_folder(dst) as work:
        assert work.parent == dst.parent and not dst.exists()
        (work / "config.json").write_text("new")
    assert listing(dst) == {"config.json": "new"} and siblings(dst) == []


def test_refusals(tmp_path):
    dst = tmp_path / "ckpt"
    old_checkpoint(dst)
    with pytest.raises(FileExistsError, match="already holds a checkpoint: pass overwrite=True"):
        with atomic_folder(dst):
            pytest.fail("must refuse before yielding")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        with atomic_folder(tmp_path / "file", overwrite=True):
            pass
    only_tokenizer = tmp_path / "tok"
    only_tokenizer.mkdir()
    (only_tokenizer / "tokenizer.json").write_text("t")
    assert not holds_checkpoint(only_tokenizer)
    with atomic_folder(only_tokenizer) as work:  # not a checkpoint: allowed, and the tokenizer is kept
        (work / "model.safetensors").write_text("w")
    assert listing(only_tokenizer) == {"model.safetensors": "w", "tokenizer.json": "t"}


def test_overwrite_removes_the_old_checkpoint_and_keeps_the_rest(tmp_path):
    dst = tmp_path / "ckpt"
    old_checkpoint(dst)
    with atomic_folder(dst, overwrite=True) as work:
        (work / "config.json").write_text("new config")
        (work / "model.safetensors").write_text("new weights")
    assert listing(dst) == {"config.json": "new config", "model.safetensors": "new weights",
                            "tokenizer.json": "tokenizer", "logs/train.jsonl": "log"}
    assert siblings(dst) == []


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_exception_mid_write_keeps_the_old(tmp_path, error):
    dst = tmp_path / "ckpt"
    old_checkpoint(dst)
    before = listing(dst)
    with pytest.raises(type(error)):
        with atomic_folder(dst, overwrite=True) as work:
            (work / "model.safetensors").write_text("half")
            raise error
    assert listing(dst) == before and siblings(dst) == []


def test_leftovers_of_dead_writers_are_removed(tmp_path):
    dst = tmp_path / "ckpt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = tmp_path / f".ckpt.tmp-{dead.stdout.strip()}-deadbeef"
    leftover.mkdir()
    (leftover / "model.safetensors").write_text("torn")
    with atomic_folder(dst) as work:
        (work / "config.json").write_text("new")
    assert not leftover.exists() and listing(dst) == {"config.json": "new"}


WRITER = textwrap.dedent("""
    import sys, time
    import signal
    # Ctrl-C raises KeyboardInterrupt here even when the test runner was started with SIGINT ignored (a
    # background job of a non-interactive shell): children inherit that, and Python then installs no handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from diffusiongemma.io.atomic import atomic_folder
    dst, version = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    while True:
        with atomic_folder(dst, overwrite=True) as work:
            (work / "config.json").write_text(version)
            for i in range(20):
                (work / f"model-{i:05d}-of-00020.safetensors").write_text(version * 1000)
                time.sleep(0.002)
""")


def complete_version(folder: Path) -> str:
    files = listing(folder)
    version = files["config.json"]
    shards = {k: v for k, v in files.items() if k.startswith("model-")}
    assert set(files) - set(shards) == {"config.json"}, files.keys()
    assert len(shards) == 20 and all(v == version * 1000 for v in shards.values()), "torn checkpoint"
    return version


@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_sigint_to_a_writing_process_leaves_old_or_new(tmp_path, delay):
    dst = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", WRITER.replace("while True", "for _ in range(1)"), str(dst), "A"],
                   check=True, env=env, capture_output=True)
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(dst), "B"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(delay)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode != 0 and "KeyboardInterrupt" in err
    assert complete_version(dst) in ("A", "B")
    # an interrupt can land in the writer's clean-up and leave its temporary sibling: the next write removes it
    with atomic_folder(dst, overwrite=True) as work:
        (work / "config.json").write_text("C")
    assert siblings(dst) == [] and listing(dst) == {"config.json": "C"}
