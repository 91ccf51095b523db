"""The mutation suite (issue 37): a foreign engine loop (foreign_engine.py, written from docs/trace-format.md and the
spec, not from our `generate`), runs transformers' built-in class on the bundled Sudoku model and writes traces; each planted bug of
a class engines have shipped must fail `compare` at default flags, naming the check that catches it, and the clean
loop must pass. docs/reference-accuracy.md holds the resulting catch table."""

import json
import random

import pytest
import torch
import transformers
from foreign_engine import foreign_trace, perturbed

from diffusiongemma.cli import main
from diffusiongemma.sudoku import make_puzzle
from diffusiongemma.sudoku.demo import DEMO_MODEL
from diffusiongemma.sudoku.tokenizer import sudoku_tokenizer, encode_puzzle

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "model.safetensors").exists(), reason="no bundled model")

@pytest.fixture(scope="module")
def builtin():
    return transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    rng, tokenizer = random.Random(3), sudoku_tokenizer()
    return torch.tensor([encode_puzzle(tokenizer, make_puzzle(rng, 45)[0]) for _ in range(2)])



def compare(trace, folder, capsys, model_folder=DEMO_MODEL):
    trace.save(folder)
    capsys.readouterr()
    code = main(["compare", "--model", str(model_folder), "--trace", str(folder), "--json"])
    return code, json.loads(capsys.readouterr().out)


CATCHES = {  # bug -> the check that must catch it
    "sc_off_nonzero": "self_conditioning",
    "stop_early": "stop",
    "commit_shifted": "commit",
    "temperature_reversed": "temperature",
    "accept_untempered": "acceptance",
    "sc_untempered": "self_conditioning",
    "sc_half_vocab": "self_conditioning",
    "commit_rope_offset": "model",
    "commit_wrong_slots": "model",
    "perturbed_weight": "model",
}


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """The Sudoku model with a sliding window of 64, so that it binds on the 83-token prompt already."""
    folder = tmp_path_factory.mktemp("windowed")
    model = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    model.config.text_config.sliding_window = 64
    model.save_pretrained(folder)
    sudoku_tokenizer().save_pretrained(folder)
    return folder, type(model).from_pretrained(folder, dtype=torch.float32).eval()


def test_a_window_of_w_instead_of_w_minus_1_fails_compare_once_it_binds(windowed, prompts, tmp_path, capsys):
    folder, model = windowed
    code, summary = compare(foreign_trace(model, prompts), tmp_path / "clean", capsys, folder)
    assert code == 0, summary["failed_checks"]
    code, summary = compare(foreign_trace(model, prompts, "window_w"), tmp_path / "bug", capsys, folder)
    assert code == 1 and "model" in summary["failed_checks"]
    first = summary["checks"]["model"]["first"]
    print(f"CATCH window_w: {summary['failed_checks']} first model at canvas {first['canvas']} step {first['step']}")


def test_the_clean_foreign_loop_passes(builtin, prompts, tmp_path, capsys):
    code, summary = compare(foreign_trace(builtin, prompts), tmp_path / "clean", capsys)
    assert summary["failed_checks"] == [] and summary["skipped_checks"] == {} and code == 0
    assert summary["checks"]["stop"]["checked"] > 0


@pytest.mark.parametrize("bug", list(CATCHES))
def test_each_planted_bug_fails_compare(builtin, prompts, tmp_path, capsys, bug):
    model = perturbed(builtin) if bug == "perturbed_weight" else builtin
    code, summary = compare(foreign_trace(model, prompts, None if bug == "perturbed_weight" else bug),
                            tmp_path / bug, capsys)
    assert code == 1 and CATCHES[bug] in summary["failed_checks"], summary["failed_checks"]
    first = summary["checks"][CATCHES[bug]]["first"]
    print(f"CATCH {bug}: {summary['failed_checks']} first {CATCHES[bug]} at canvas {first['canvas']} step "
          f"{first['step']}")
