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
    assert line["puzzle"] == EASY and set(line) == {"puzzle", "givens", "solution", "valid", "steps"}
    assert line["givens"] == 78
    assert line["valid"] and line["solution"] == SOLUTION
    assert 1 <= line["steps"] <= 48


@needs_demo_model
def test_demo_puzzles_file_and_eval_json(tmp_path, capsys):
    path = tmp_path / "puzzles.txt"
    path.write_text(f"# two puzzles\n{EASY}\n\n{EASY.replace('.', '0')}\n")
    assert main(["sudoku", "--puzzles", str(path), "--json", "--max-steps", "4"]) == 0
    lines = json_lines(capsys)
    assert [line["puzzle"] for line in lines] == [EASY, EASY] and all(line["steps"] <= 4 for line in lines)
    assert all(line["valid"] and line["solution"] == SOLUTION for line in lines)  # three blanks: solved
    assert main(["sudoku", "--eval", "4", "--givens", "75", "--json", "--seed", "1", "--max-steps", "6"]) == 0
    (summary,) = json_lines(capsys)
    assert summary["givens"] == 75 and summary["count"] == 4 and summary["mean_steps"] <= 6
    assert summary["solve_rate"] >= 0.75  # six blanks: the demo model solves (nearly) all of them


@needs_demo_model
def test_demo_animates_every_step(capsys):
    assert main(["sudoku", "--puzzle", EASY, "--seed", "0", "--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "step 1" in out and "denoising steps" in out


class Sink:
    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(text)

    def flush(self):
        pass


def one_hot_logits(tok, grid: str) -> torch.Tensor:
    """[1, L, V] logits putting all mass on each cell's digit ('.' = uniform over the vocabulary)."""
    logits = torch.zeros(1, 82, len(tok))
    for i, c in enumerate(grid):
        if c != ".":
            logits[0, i, tok.convert_tokens_to_ids(c)] = 50.0
    return logits


def test_grid_animator_highlights_revised_cells():
    tok = sudoku_tokenizer()
    puzzle, solution = make_puzzle(__import__("random").Random(0), 40)
    blank = puzzle.index(".")
    wrong = str(int(solution[blank]) % 9 + 1)
    highlight = "\x1b[30;43m"
    sink = Sink()
    anim = GridAnimator(tok, puzzle, stream=sink)
    anim.put(torch.tensor([[2] * 83]))  # the prompt: nothing drawn
    assert sink.parts == []
    early = "." * 81  # step 1: not confident anywhere, only the givens show
    anim.put_draft(logits=one_hot_logits(tok, early))
    assert "step 1: 0/41 cells, 0 revised" in sink.parts[-1] and highlight not in sink.parts[-1]
    draft = solution[:blank] + wrong + solution[blank + 1:]  # step 2: everything, one cell wrong
    anim.put_draft(logits=one_hot_logits(tok, draft))
    assert "step 2: 41/41 cells, 0 revised" in sink.parts[-1] and highlight not in sink.parts[-1]
    anim.put_draft(logits=one_hot_logits(tok, solution))  # step 3: the wrong cell is revised
    assert "step 3: 41/41 cells, 1 revised" in sink.parts[-1]
    assert sink.parts[-1].count(highlight) == 1 and f"{highlight}{solution[blank]}" in sink.parts[-1]
    assert sink.parts[-2] == "\x1b[14F\x1b[J"  # every redraw moves back over the last grid
    ids = tok.encode(solution, add_special_tokens=False) + [tok.eos_token_id]
    anim.put(torch.tensor([ids]))  # the committed canvas: drawn in full, the revision still highlighted
    assert "done after 3 steps; 1 cells revised" in sink.parts[-1] and sink.parts[-1].count(highlight) == 1


def test_canvas_cells_shows_digits_only():
    tok = sudoku_tokenizer()
    assert canvas_cells(tok, [0, 5, 13] + [1] * 80) == ".19" + "." * 78
