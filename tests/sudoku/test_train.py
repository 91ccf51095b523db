"""Tests of the Sudoku training recipe (sudoku/train.py) and `diffusiongemma train sudoku`."""

import json
import random

import torch

from diffusiongemma.cli import main
from diffusiongemma.modeling import DiffusionGemmaForBlockDiffusion
from diffusiongemma.sudoku import is_solved, is_valid_solution, make_puzzle, sudoku_tokenizer
from diffusiongemma.sudoku.train import apply_symmetry, make_batch, random_symmetry, warmup_cosine


def test_symmetries_keep_puzzles_solved():
    rng = random.Random(0)
    puzzle, solution = make_puzzle(rng, 40)
    for _ in range(20):
        cells, digits = random_symmetry(rng)
        p, s = apply_symmetry(puzzle, cells, digits), apply_symmetry(solution, cells, digits)
        assert is_valid_solution(s) and is_solved(p, s) and p.count(".") == puzzle.count(".")


def test_batch_layout():
    tok = sudoku_tokenizer()
    puzzle, solution = make_puzzle(random.Random(1), 50)
    input_ids, labels = make_batch([(puzzle, solution)], tok)
    assert input_ids.shape == (1, 83) and labels.shape == (1, 82)
    assert input_ids[0, 0] == tok.bos_token_id and input_ids[0, -1] == tok.sep_token_id
    assert labels[0, -1] == tok.eos_token_id and tok.decode(labels[0, :81]) == solution


def test_warmup_cosine():
    assert warmup_cosine(0, 10, 100) == 0.1 and warmup_cosine(9, 10, 100) == 1.0
    assert abs(warmup_cosine(100, 10, 100) - 0.1) < 1e-9


def test_train_runs_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "sudoku", "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "2",
            "--eval-puzzles", "2", "--pool-size", "4", "--hidden-size", "32", "--layers", "2", "--givens", "60"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["step"] == 2 and 0 <= first["solve_rate"] <= 1
    for name in ("model.safetensors", "tokenizer.json", "generation_config.json", "checkpoint/trainer_state.pt"):
        assert (out / name).exists(), name
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 2
    before = DiffusionGemmaForBlockDiffusion.from_pretrained(out).state_dict()

    assert main([*args[:5], "4", *args[6:], "--resume"]) == 0  # --steps 4, continue from step 2
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == [2, 4]
    after = DiffusionGemmaForBlockDiffusion.from_pretrained(out).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == 4
