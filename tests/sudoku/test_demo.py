"""Tests of `diffusiongemma sudoku` (sudoku/cli.py, sudoku/demo.py) with the bundled demo model."""

import json

import pytest
import torch

from diffusiongemma.cli import main
from diffusiongemma.sudoku import is_solved, make_puzzle, sudoku_tokenizer
from diffusiongemma.sudoku.demo import DEMO_MODEL, GridAnimator, canvas_cells

SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
EASY = "." + SOLUTION[1:40] + "." + SOLUTION[41:80] + "."  # three blanks

needs_demo_model = pytest.mark.skipif(not (DEMO_MODEL / "model.safetensors").exists(), reason="no bundled model")


def json_lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


@needs_demo_model
def test_demo_solves_an_easy_puzzle(capsys):
    assert main(["sudoku", "--puzzle", EASY, "--json", "--seed", "0"]) == 0
    (line,) = json_lines(capsys)
    assert line["puzzle"] == EASY and set(line) == {"puzzle", "solution", "valid", "steps"}
    assert line["valid"] and line["solution"] == SOLUTION
    assert 1 <= line["steps"] <= 48


@needs_demo_model
def test_demo_puzzles_file_and_eval_json(tmp_path, capsys):
    path = tmp_path / "puzzles.txt"
    path.write_text(f"# two puzzles\n{EASY}\n\n{EASY.replace('.', '0')}\n")
    assert main(["sudoku", "--puzzles", str(path), "--json", "--max-steps", "4"]) == 0
    lines = json_lines(capsys)
    assert [line["puzzle"] for line in lines] == [EASY, EASY] and all(line["steps"] <= 4 for line in lines)
    assert main(["sudoku", "--eval", "2", "--givens", "60", "--json", "--seed", "1", "--max-steps", "4"]) == 0
    (summary,) = json_lines(capsys)
    assert summary["givens"] == 60 and summary["count"] == 2 and 0 <= summary["solve_rate"] <= 1
    assert summary["mean_steps"] <= 4


@needs_demo_model
def test_demo_animates_every_step(capsys):
    assert main(["sudoku", "--puzzle", EASY, "--seed", "0", "--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "step 1" in out and "denoising steps" in out


def test_grid_animator_redraws_in_place():
    tok = sudoku_tokenizer()
    puzzle, solution = make_puzzle(__import__("random").Random(0), 40)
    assert is_solved(puzzle, solution)
    ids = tok.encode(solution, add_special_tokens=False) + [tok.eos_token_id]
    lines = []

    class Sink:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    anim = GridAnimator(tok, puzzle, stream=Sink())
    anim.put_draft(value=torch.tensor([ids]))
    anim.put_draft(value=torch.tensor([ids]))
    assert anim.steps == 2 and "\x1b[14F" in "".join(lines)  # the second draw moves back over the first
    assert canvas_cells(tok, [0, 5, 13] + [1] * 80) == ".19" + "." * 78
