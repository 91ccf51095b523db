"""Dataset loader and metric of the Sudoku lm-eval tasks (sudoku_solve.yaml, sudoku_choice.yaml): the data is the
JSONL file next to this one, read offline with `datasets`' json builder."""

from pathlib import Path

import datasets

from diffusiongemma.sudoku.puzzles import is_solved

HERE = Path(__file__).resolve().parent


def load_sudoku(data_file: str = "sudoku_36.jsonl", **kwargs) -> datasets.DatasetDict:
    """{"test": the puzzles of `data_file` (a path relative to this folder)}."""
    return datasets.load_dataset("json", data_files={"test": str(HERE / data_file)})


def solved(doc: dict, results: list[str]) -> dict:
    """1.0 when the generated grid (its first 81 characters, as `diffusiongemma sudoku` decodes) solves the puzzle."""
    return {"solved": float(is_solved(doc["puzzle"], results[0][:81]))}
