"""cli.py `run_command`: a run-time error of any subcommand prints one `error:` line naming the cause and exits
non-zero, without a traceback (DIFFUSIONGEMMA_TRACEBACK=1 shows it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_model, tiny_tokenizer
from diffusiongemma.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_ckpt")
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_missing_model_folder(tmp_path, capsys):
    assert main(["generate", "hi", "--model", str(tmp_path / "nowhere")]) == 1
    assert error_line(capsys) == f"error: model folder {tmp_path / 'nowhere'} does not exist"


@pytest.mark.parametrize("setup, message", [
    (lambda p: (p / "config.json").write_text(json.dumps({"model_type": "llama"})),
     "holds a llama checkpoint, not DiffusionGemma"),
    (lambda p: (p / "tokenizer.json").write_text("{}"), "holds no config.json"),
    (lambda p: (p / "config.json").write_text("{oops"), "config.json is not valid JSON"),
])
def test_not_a_diffusiongemma_folder(tmp_path, capsys, setup, message):
    setup(tmp_path)
    assert main(["generate", "hi", "--model", str(tmp_path)]) == 1
    assert message in error_line(capsys)


def test_nan_weights_name_the_step(tmp_path, capsys):
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight[5, 0] = float("nan")
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    assert main(["generate", "hi", "--model", str(tmp_path), "--max-new-tokens", "16", "--steps", "2",
                 "--quiet"]) == 1
    assert "non-finite logits at denoising step 1 of canvas 0" in error_line(capsys)


@pytest.mark.parametrize("argv, message", [
    (lambda f, t: ["quantize", "--scheme", "fp8-dynamic", str(t / "missing"), str(t / "out")], "does not exist"),
    (lambda f, t: ["quantize", "--scheme", "fp8-dynamic", str(f), str(t / "file")], "is a file, not a folder"),
    (lambda f, t: ["quantize", "--scheme", "fp8-dynamic", str(f), str(f)], "must differ from the source"),
])
def test_quantize_errors(folder, tmp_path, capsys, argv, message):
    (tmp_path / "file").write_text("x")
    assert main(argv(folder, tmp_path)) == 1
    assert message in error_line(capsys)


def test_traceback_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFUSIONGEMMA_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main(["generate", "hi", "--model", str(tmp_path / "nowhere")])


def test_process_exit_code_and_one_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    env.pop("DIFFUSIONGEMMA_TRACEBACK", None)
    done = subprocess.run([sys.executable, "-m", "diffusiongemma", "generate", "hi", "--model",
                           str(tmp_path / "nowhere")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: model folder {tmp_path / 'nowhere'} does not exist"]
