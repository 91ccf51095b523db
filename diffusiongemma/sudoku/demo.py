"""The Sudoku demo: load the bundled model, solve puzzles, animate the denoising in the terminal.

`diffusiongemma sudoku` (see `sudoku/cli.py`) is a thin wrapper around `load_demo_model`, `GridAnimator`,
`solve_puzzles` and `evaluate_fresh`.
"""

import random
import sys
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from ..modeling import DiffusionGemmaForBlockDiffusion
from .puzzles import BLANK, DIGITS, make_puzzle, render_grid
from .solver import SolveResult, solve_puzzles, solve_rate
from .tokenizer import sudoku_tokenizer

DEMO_MODEL = Path(__file__).resolve().parent / "demo_model"
GRID_LINES = 13  # render_grid draws 13 lines


def load_demo_model(path: str | Path | None = None) -> tuple[DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerFast]:
    """(model in eval mode, tokenizer) from `path`, default: the bundled demo model."""
    path = Path(path) if path is not None else DEMO_MODEL
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model in {path} (expected config.json and model.safetensors)")
    # the bundled weights are stored in bf16 to keep the package small; Sudoku runs in fp32
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = (
        PreTrainedTokenizerFast.from_pretrained(path) if (path / "tokenizer.json").exists() else sudoku_tokenizer()
    )
    return model, tokenizer


def canvas_cells(tokenizer, ids: list[int]) -> str:
    """The first 81 canvas tokens as grid cells, position by position: a digit token shows, anything else is '.'."""
    chars = [tokenizer.convert_ids_to_tokens(i) for i in ids[:81]]
    return "".join(c if c in DIGITS else BLANK for c in chars).ljust(81, BLANK)


class GridAnimator:
    """Streamer that redraws the 9x9 grid in place after every denoising step (batch 1).

    Args:
        tokenizer: the Sudoku tokenizer.
        puzzle: the puzzle being solved (its givens are drawn bold, changed cells highlighted).
        stream: where to draw (default stdout).
    """

    def __init__(self, tokenizer, puzzle: str, stream=None):
        self.tokenizer = tokenizer
        self.puzzle = puzzle
        self.stream = stream or sys.stdout
        self.previous: str | None = None
        self.steps = 0

    def put(self, value) -> None:  # prompt and committed canvas: the last draft is already on screen
        pass

    def put_draft(self, value=None, logits=None) -> None:
        if value is None:
            return
        cells = canvas_cells(self.tokenizer, value[0].tolist())
        if self.previous is not None:
            self.stream.write(f"\x1b[{GRID_LINES + 1}F\x1b[J")  # back to the grid's first line, erase below
        self.steps += 1
        self.stream.write(render_grid(self.puzzle, cells, self.previous) + f"\nstep {self.steps}\n")
        self.stream.flush()
        self.previous = cells

    def end(self) -> None:
        pass


def fresh_puzzles(count: int, givens: int, seed: int | None) -> list[str]:
    """`count` uniquely solvable puzzles with `givens` givens."""
    rng = random.Random(seed)
    return [make_puzzle(rng, givens)[0] for _ in range(count)]


def solve_one(model, tokenizer, puzzle: str, animate: bool, **generate_kwargs) -> SolveResult:
    streamer = GridAnimator(tokenizer, puzzle) if animate else None
    (result,) = solve_puzzles(model, tokenizer, [puzzle], streamer=streamer, **generate_kwargs)
    return result


def evaluate_fresh(model, tokenizer, count: int, givens: int, seed: int | None, batch_size: int = 50,
                   **generate_kwargs) -> dict:
    """Solve rate, mean and median steps on `count` fresh puzzles (`solve_rate` keys plus `givens`)."""
    puzzles = fresh_puzzles(count, givens, seed)
    results = []
    for i in range(0, count, batch_size):
        results += solve_puzzles(model, tokenizer, puzzles[i : i + batch_size], **generate_kwargs)
    return {**solve_rate(results), "givens": givens}


def seed_everything(seed: int | None) -> None:
    """Seeds generation's global torch RNG (spec D: the reference draws from it); None leaves it random."""
    if seed is not None:
        torch.manual_seed(seed)
