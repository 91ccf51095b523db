"""The command line: help for every command, generate with every documented flag, clear argument errors."""

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from conftest import tiny_tokenizer
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.cli import main

COMMANDS = ("generate", "sudoku", "train", "quantize")
REPO = Path(__file__).resolve().parents[1]


def run_here(argv: list[str], cwd) -> subprocess.CompletedProcess:
    """Run a command in a fresh process that imports this checkout's `diffusiongemma` (not an installed copy)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"    {command} " in out


def test_generate_help_explains_flags(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    flags = ("--model", "--max-new-tokens", "--steps", "--seed", "--sampling", "--compile", "--dtype", "--chat",
             "--show-drafts")
    for flag in flags:
        assert flag in out


def test_generate_prints_the_same_text_as_generate(saved_pair, capsys):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), "--max-new-tokens", "16", "--steps", "3", "--seed", "7",
                 "--quiet", "hello"]) == 0
    printed = capsys.readouterr().out
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    tok = tiny_tokenizer()
    torch.manual_seed(7)
    out = model.generate(tok("hello", return_tensors="pt")["input_ids"], max_new_tokens=16, max_denoising_steps=3)
    assert printed.strip() == tok.decode(out.sequences[0, 5:], skip_special_tokens=True).strip()


def test_generate_fast_sampling_prints_the_fast_tokens(saved_pair, capsys):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), "--max-new-tokens", "16", "--steps", "3", "--seed", "7",
                 "--sampling", "fast", "--quiet", "hello"]) == 0
    printed = capsys.readouterr().out
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    tok = tiny_tokenizer()
    out = model.generate(tok("hello", return_tensors="pt")["input_ids"], max_new_tokens=16, max_denoising_steps=3,
                         sampling="fast", seed=7)
    assert printed.strip() == tok.decode(out.sequences[0, 5:], skip_special_tokens=True).strip()


def test_generate_compile_flag_reaches_generate(saved_pair, monkeypatch, capsys):
    path, _, _ = saved_pair
    seen = {}
    real = DiffusionGemmaForBlockDiffusion.generate

    def spy(self, *args, **kwargs):
        seen.update(kwargs)
        return real(self, *args, **dict(kwargs, compile={"backend": "eager"}))  # tracing only: fast

    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "generate", spy)
    assert main(["generate", "--model", str(path), "--max-new-tokens", "16", "--steps", "2", "--compile", "--quiet",
                 "hi"]) == 0
    assert seen["compile"] is True


def test_generate_chat_show_drafts_and_progress(saved_pair, capsys):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), "--max-new-tokens", "32", "--steps", "2", "--chat",
                 "--show-drafts", "--dtype", "float32", "hi"]) == 0
    captured = capsys.readouterr()
    assert "[canvas 1/2, step 1] " in captured.err  # not a terminal: one plain line per draft on stderr
    assert "tokens per forward" in captured.err
    assert "[canvas" not in captured.out and "\x1b" not in captured.out + captured.err


@pytest.mark.parametrize("argv,message", [
    (["generate", "--model", "x", "--steps", "0", "p"], "expected an integer in [1, 100000]"),
    (["generate", "--model", "x", "--steps", "2147483648", "p"], "expected an integer in [1, 100000]"),
    (["generate", "--model", "x", "--seed", str(2**32), "p"], "the CPU generator keeps 32 bits"),
    (["generate", "--model", "x", "--seed", "-1", "p"], "--seed"),
    (["trace", "--model", "x", "--prompt", "p", "--out", "o", "--steps", "2147483648"], "--steps"),
    (["sudoku", "--seed", str(2**64)], "--seed"),
    (["sudoku", "--max-steps", "2147483648"], "--max-steps"),
    (["generate", "--model", "x", "--dtype", "float8", "p"], "--dtype must be one of"),
    (["generate", "p"], "--model"),
])
def test_bad_arguments_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_console_script_entry_point_is_main():
    try:
        (script,) = entry_points(group="console_scripts", name="diffusiongemma")
    except ValueError:
        pytest.skip("diffusiongemma is not installed (pip install -e .)")
    assert script.value == "diffusiongemma.cli:main"


def test_console_script_generates_what_main_prints(saved_pair, capsys, tmp_path):
    script = shutil.which("diffusiongemma", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the diffusiongemma console script is not installed next to this Python (pip install -e .)")
    path, _, _ = saved_pair
    argv = ["generate", "--model", str(path), "--max-new-tokens", "16", "--steps", "3", "--seed", "7", "--quiet",
            "hello"]
    out = run_here([script, *argv], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert main(argv) == 0
    expected = capsys.readouterr().out
    assert expected.strip() and out.stdout == expected


def test_python_m_diffusiongemma_runs_the_command_line(tmp_path):
    out = run_here([sys.executable, "-m", "diffusiongemma", "--help"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: diffusiongemma ")
    for command in COMMANDS:
        assert f"    {command} " in out.stdout


def test_progress_line_shows_canvas_step_and_rate(saved_pair, capsys):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), "--max-new-tokens", "32", "--steps", "2", "x"]) == 0
    err = capsys.readouterr().err  # not a terminal: one plain line per committed canvas
    assert "[canvas 1/2 done, 2 steps, tokens/forward 8.00]\n[canvas 2/2 done, 2 steps, tokens/forward" in err
