"""`diffusiongemma sudoku` through the real entry point (sudoku/cli.py): bad puzzles and non-Sudoku models are refused
with one clear error line, the output is plain text off a terminal or with --no-color / NO_COLOR, and the default
puzzle is one the bundled model can solve, with its difficulty printed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_model, tiny_tokenizer
from diffusiongemma.cli import main
from diffusiongemma.sudoku.cli import DEFAULT_GIVENS
from diffusiongemma.sudoku.demo import DEMO_MODEL

REPO = Path(__file__).resolve().parents[2]
SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
EASY = "." + SOLUTION[1:40] + "." + SOLUTION[41:80] + "."  # three blanks
# row 1 holds 1-8, so its last cell needs a 9, which column 9 already has (row 2): no clash, no solution
UNSOLVABLE = "12345678." + "........9" + "." * 63

needs_demo_model = pytest.mark.skipif(not (DEMO_MODEL / "model.safetensors").exists(), reason="no bundled model")


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    return line


def with_cell(grid: str, row: int, col: int, digit: str) -> str:
    i = 9 * (row - 1) + (col - 1)
    return grid[:i] + digit + grid[i + 1:]


@pytest.mark.parametrize("puzzle, message", [
    ("", "error: --puzzle: puzzle must be 81 characters of 1-9, '.' or '0'; got 0 characters"),
    (EASY[:80], "got 80 characters"),
    (EASY[:80] + "x", "got 'x' at index 80"),
], ids=["empty", "short", "bad-char"])
def test_malformed_puzzle_is_refused(puzzle, message, capsys):
    assert main(["sudoku", "--puzzle", puzzle]) == 1  # '' used to solve a random puzzle instead
    assert message in error_line(capsys)


@pytest.mark.parametrize("cells, clash", [
    ([(3, 1, "5"), (3, 7, "5")], "digit 5 appears twice in row 3 (row 3 column 1, row 3 column 7)"),
    ([(2, 4, "8"), (9, 4, "8")], "digit 8 appears twice in column 4 (row 2 column 4, row 9 column 4)"),
    ([(4, 7, "1"), (6, 9, "1")], "digit 1 appears twice in box 6 (row 4 column 7, row 6 column 9)"),
])
def test_clashing_givens_are_named(cells, clash, capsys):
    puzzle = "." * 81
    for row, col, digit in cells:
        puzzle = with_cell(puzzle, row, col, digit)
    assert main(["sudoku", "--puzzle", puzzle]) == 1
    assert error_line(capsys) == f"error: --puzzle: the puzzle breaks the rules: {clash}"


def test_unsolvable_puzzle_says_so(capsys):
    assert main(["sudoku", "--puzzle", UNSOLVABLE]) == 1
    assert "--puzzle: the puzzle has no solution" in error_line(capsys)


def test_puzzles_file_empty_or_bad(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("# only a comment\n\n")
    assert main(["sudoku", "--puzzles", str(empty)]) == 1
    assert f"--puzzles {empty}: the file holds no puzzle" in error_line(capsys)
    bad = tmp_path / "bad.txt"
    bad.write_text(f"{EASY}\n{with_cell(EASY, 1, 1, '3')}\n{UNSOLVABLE}\n")  # line 2: two 3s in row 1 (and box 1)
    assert main(["sudoku", "--puzzles", str(bad)]) == 1
    assert f"{bad}, line 2: the puzzle breaks the rules: digit 3 appears twice in row 1" in error_line(capsys)
    bad.write_text(f"{EASY}\n{UNSOLVABLE}\n")
    assert main(["sudoku", "--puzzles", str(bad)]) == 1
    assert f"{bad}, line 2: the puzzle has no solution" in error_line(capsys)


def test_non_sudoku_model_is_refused(tmp_path, capsys):
    with_tokenizer, without = tmp_path / "with_tokenizer", tmp_path / "without"
    tiny_model().save_pretrained(with_tokenizer)
    tiny_tokenizer().save_pretrained(with_tokenizer)
    tiny_model().save_pretrained(without)  # the Sudoku tokenizer is then assumed: the vocabulary sizes differ
    assert main(["sudoku", "--model", str(with_tokenizer), "--puzzle", EASY]) == 1
    assert f"--model {with_tokenizer} is not a Sudoku model: its tokenizer lacks the Sudoku vocabulary" \
        in error_line(capsys)
    assert main(["sudoku", "--model", str(without), "--puzzle", EASY]) == 1
    assert error_line(capsys) == (f"error: --model {without} is not a Sudoku model: its vocabulary has 128 tokens, "
                                  "the Sudoku tokenizer's 15")


@needs_demo_model
def test_not_a_terminal_gets_plain_text():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    env.pop("NO_COLOR", None)
    out = subprocess.run([sys.executable, "-m", "diffusiongemma", "sudoku", "--puzzle", EASY, "--seed", "0",
                          "--max-steps", "3"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout
    assert "puzzle: 78 givens, 3 blanks" in out.stdout and "step 1: " in out.stdout
    assert "| . 3 4 | 6 7 8 | 9 1 2 |" in out.stdout  # the puzzle's first row, plain
    assert "valid solution in" in out.stdout and out.stdout.count("+-------+-------+-------+") == 8  # puzzle and final grid


@needs_demo_model
@pytest.mark.parametrize("how", ["terminal", "--no-color", "NO_COLOR"])
def test_no_color_flag_and_env(how, monkeypatch, capsys):
    monkeypatch.setattr("diffusiongemma.sudoku.cli.is_terminal", lambda stream: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    argv = ["sudoku", "--puzzle", EASY, "--seed", "0", "--max-steps", "2"]
    if how == "--no-color":
        argv.append("--no-color")
    if how == "NO_COLOR":
        monkeypatch.setenv("NO_COLOR", "1")
    assert main(argv) == 0
    out = capsys.readouterr().out
    if how == "terminal":
        assert "\x1b[1m" in out and "\x1b[14F" in out  # bold givens, the grid redrawn in place
    else:
        assert "\x1b" not in out and "step 1: " in out


@needs_demo_model
def test_default_puzzle_is_easy_enough_and_says_how_hard(capsys):
    assert main(["sudoku", "--seed", "0", "--json", "--max-steps", "8"]) == 0
    (line,) = [json.loads(text) for text in capsys.readouterr().out.splitlines() if text.strip()]
    assert line["givens"] == DEFAULT_GIVENS == 81 - line["puzzle"].count(".")
    assert main(["sudoku", "--seed", "0", "--no-animation", "--max-steps", "8"]) == 0
    out = capsys.readouterr().out
    assert f"puzzle: {DEFAULT_GIVENS} givens, {81 - DEFAULT_GIVENS} blanks" in out
    assert f"denoising steps ({DEFAULT_GIVENS} givens, {81 - DEFAULT_GIVENS} blanks)" in out
