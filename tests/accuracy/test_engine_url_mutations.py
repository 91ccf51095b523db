"""`compare --engine-url` against the foreign engine loop (foreign_engine.py) served on loopback: the clean loop
passes, and a planted bug its answers show (the committed canvas shifted by one token) fails from answers alone
(issue 37; benchmarks/engine_url_catch.py measures every bug of the catch table the same way)."""

import json
import random

import pytest
import torch
import transformers
from foreign_engine import ForeignEngineServer

from diffusiongemma.cli import main
from diffusiongemma.sudoku import make_puzzle
from diffusiongemma.sudoku.demo import DEMO_MODEL
from diffusiongemma.sudoku.tokenizer import sudoku_tokenizer

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "model.safetensors").exists(), reason="no bundled model")


@pytest.fixture(scope="module")
def builtin():
    return transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()


@pytest.fixture
def puzzles(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "puzzles.txt"
    path.write_text("".join(f"<bos>{make_puzzle(rng, 45)[0].replace('0', '.')}|\n" for _ in range(2)))
    return path


def compare(builtin, bug, puzzles, capsys) -> tuple[int, dict]:
    server = ForeignEngineServer(builtin, sudoku_tokenizer(), bug)
    try:
        capsys.readouterr()
        code = main(["compare", "--model", str(DEMO_MODEL), "--engine-url", server.url, "--prompts", str(puzzles),
                     "--samples", "2", "--json"])
    finally:
        server.stop()
    return code, json.loads(capsys.readouterr().out)


def test_the_clean_foreign_engine_passes(builtin, puzzles, capsys, one_thread):
    code, summary = compare(builtin, None, puzzles, capsys)
    assert code == 0 and summary["verdict"] == "pass" and summary["engine"]["answers"] == 4
    assert summary["tokens_from"] == "token_ids"


def test_a_shifted_commit_fails_from_answers_alone(builtin, puzzles, capsys, one_thread):
    code, summary = compare(builtin, "commit_shifted", puzzles, capsys)
    assert code == 1 and summary["verdict"] == "fail"
    assert summary["logprob_difference"]["difference"] < -1 and summary["engine"]["argmax_agree"] < 0.5
