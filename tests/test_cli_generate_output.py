"""`diffusiongemma generate` through the real entry point (`python -m diffusiongemma`, a fresh process): the tokenizer
is never guessed, no escape codes reach a file or pipe, terminals get them unless --no-color / NO_COLOR, and the
progress display has no line after the last step (diffusiongemma/cli.py, generation/streamers.py)."""

import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diffusiongemma.cli import main

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--max-new-tokens", "32", "--steps", "2", "--seed", "3"]


def env(**extra) -> dict:
    base = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**base, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def run_piped(argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diffusiongemma", *argv], capture_output=True, text=True, env=env(),
                          timeout=300)


def run_in_terminal(argv) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal; returns (exit code, everything the terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "diffusiongemma", *argv], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def no_tokenizer(saved_pair, tmp_path_factory):
    """The saved checkpoint without its tokenizer files."""
    path, _, _ = saved_pair
    bare = tmp_path_factory.mktemp("bare")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(path / name, bare / name)
    return bare


def test_model_folder_without_tokenizer_is_refused(no_tokenizer):
    run = run_piped(["generate", "--model", str(no_tokenizer), *ARGS, "hi"])
    assert run.returncode == 2
    assert run.stdout == ""
    assert f"--model {no_tokenizer} has no tokenizer files" in run.stderr and "pass --tokenizer" in run.stderr


def test_piped_output_is_plain_text_with_the_tokenizer_given(saved_pair, no_tokenizer, capsys):
    path, _, _ = saved_pair
    run = run_piped(["generate", "--model", str(no_tokenizer), "--tokenizer", str(path), "--show-drafts", *ARGS,
                     "hi"])
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stdout + run.stderr  # before: cursor and colour codes for every draft
    assert main(["generate", "--model", str(path), "--quiet", *ARGS, "hi"]) == 0
    assert run.stdout == capsys.readouterr().out  # the text only, the same as with the checkpoint's own tokenizer
    drafts = [line for line in run.stderr.splitlines() if line.startswith("[canvas")]
    assert [d.split("]")[0] for d in drafts] == ["[canvas 1/2, step 1", "[canvas 1/2, step 2", "[canvas 2/2, step 1",
                                                 "[canvas 2/2, step 2"]


def test_piped_progress_is_one_line_per_canvas_and_none_after_the_last(saved_pair, capsys):
    path, _, _ = saved_pair  # in this process: capsys' stderr is not a terminal either
    assert main(["generate", "--model", str(path), *ARGS, "hi"]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("[")] == [
        "[canvas 1/2 done, 2 steps, tokens/forward 8.00]", "[canvas 2/2 done, 2 steps, tokens/forward 8.00]",
        "[2 canvas(es) max, tokens per forward: 8.00]"]


def test_no_color_flag_and_environment_variable_on_a_terminal(saved_pair, capsys, monkeypatch):
    path, _, _ = saved_pair
    monkeypatch.setattr("diffusiongemma.generation.streamers.is_terminal", lambda stream: True)  # read by cli.py
    argv = ["generate", "--model", str(path), "--show-drafts", *ARGS, "hi"]
    assert main(argv) == 0
    assert "\x1b7" in capsys.readouterr().out  # colour allowed: drafts redrawn in place
    assert main(argv + ["--no-color"]) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err and "[canvas 2/2, step 2] " in captured.err
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err and "[canvas 2/2, step 2] " in captured.err


def test_terminal_progress_is_rewritten_in_place_and_none_after_the_last_step(saved_pair):
    path, _, _ = saved_pair
    code, screen = run_in_terminal(["generate", "--model", str(path), *ARGS, "hi"])
    assert code == 0, screen
    assert "\r\x1b[K[canvas 2/2, step 2" in screen
    assert "step 0" not in screen  # before: "[canvas 2/2, step 0, ...]" after the last step
