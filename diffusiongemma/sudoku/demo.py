"""The Sudoku demo: load the bundled model, solve puzzles, animate the denoising in the terminal.

`diffusiongemma sudoku` (see `sudoku/cli.py`) is a thin wrapper around `load_demo_model`, `GridAnimator`,
`solve_puzzles` and `evaluate_fresh`.
"""

import random
import sys
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from ..model import DiffusionGemmaForBlockDiffusion
from ..modeling.config import check_model_folder
from .puzzles import BLANK, DIGITS, make_puzzle
from .render import render_grid
from .solver import SolveResult, solve_puzzles, solve_rate
from .tokenizer import VOCAB, sudoku_tokenizer

DEMO_MODEL = Path(__file__).resolve().parent / "demo_model"
GRID_LINES = 13  # render_grid draws 13 lines


def load_demo_model(path: str | Path | None = None) -> tuple[DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerFast]:
    """(model in eval mode, tokenizer) from `path`, default: the bundled demo model."""
    path = Path(path) if path is not None else DEMO_MODEL
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model in {path} (expected config.json and model.safetensors)")
    check_model_folder(str(path))  # "not a DiffusionGemma checkpoint" before anything else
    # the bundled weights are stored in bf16 to keep the package small; Sudoku runs in fp32
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = (
        PreTrainedTokenizerFast.from_pretrained(path) if (path / "tokenizer.json").exists() else sudoku_tokenizer()
    )
    check_sudoku_model(model, tokenizer, path)
    return model, tokenizer


def check_sudoku_model(model, tokenizer, path) -> None:
    """Refuse a model that was not trained on Sudoku: its tokenizer must hold the Sudoku vocabulary (see
    `sudoku/tokenizer.py`) with the same ids, its vocabulary must be that size, and a canvas must fit 81 digits and
    <eos>. Otherwise generation fails deep in torch or silently writes garbage.

    Raises:
        ValueError: naming the folder and what does not match.
    """
    vocab = tokenizer.get_vocab()
    wrong = [token for token, index in VOCAB.items() if vocab.get(token) != index]
    if wrong or tokenizer.sep_token_id != VOCAB["|"] or tokenizer.bos_token_id != VOCAB["<bos>"]:
        shown = ", ".join(repr(t) for t in wrong[:5]) or "the <bos> and '|' special tokens"
        raise ValueError(f"--model {path} is not a Sudoku model: its tokenizer lacks the Sudoku vocabulary "
                         f"({len(VOCAB)} tokens: <pad> <eos> <bos> <unk> . 1-9 |); missing or renumbered: {shown}")
    vocab_size = model.get_output_embeddings().weight.shape[0]
    if vocab_size != len(VOCAB):
        raise ValueError(f"--model {path} is not a Sudoku model: its vocabulary has {vocab_size} tokens, the Sudoku "
                         f"tokenizer's {len(VOCAB)}")
    if model.canvas_length < 82:
        raise ValueError(f"--model {path} is not a Sudoku model: its canvas holds {model.canvas_length} tokens, "
                         "a solution needs 82 (81 digits and <eos>)")


def canvas_cells(tokenizer, ids: list[int]) -> str:
    """The first 81 canvas tokens as grid cells, position by position: a digit token shows, anything else is '.'."""
    chars = [tokenizer.convert_ids_to_tokens(i) for i in ids[:81]]
    return "".join(c if c in DIGITS else BLANK for c in chars).ljust(81, BLANK)


def confident_cells(tokenizer, logits: torch.Tensor, threshold: float) -> str:
    """The first 81 canvas positions as grid cells: the most likely digit where its probability reaches
    `threshold`, '.' elsewhere (also where a non-digit token is most likely).

    Args:
        logits: [L, V] one canvas's (temperature-scaled) logits.
    """
    probs = torch.softmax(logits[:81].float(), dim=-1)  # [81, V]
    best, ids = probs.max(dim=-1)  # [81], [81]
    cells = canvas_cells(tokenizer, ids.tolist())
    return "".join(c if p >= threshold else BLANK for c, p in zip(cells, best.tolist()))


class GridAnimator:
    """Streamer that redraws the 9x9 grid in place after every denoising step (batch 1).

    A cell appears once the model is confident about it (its most likely digit reaches `threshold` under the
    step's logits). A cell whose digit later changes is *revised*: it stays highlighted (black on yellow), so
    the animation shows where the model changed its mind. The committed canvas is drawn in full at the end.

    Args:
        tokenizer: the Sudoku tokenizer.
        puzzle: the puzzle being solved (its givens are drawn bold).
        stream: where to draw (default stdout).
        threshold: probability from which a cell is shown.
        ansi: redraw in place with colours (for a terminal). Without, nothing but plain text is written: one
            line per step, then the final grid.
    """

    _takes_logits = True  # spec D.7: put_draft(logits=...) instead of the argmax canvas

    def __init__(self, tokenizer, puzzle: str, stream=None, threshold: float = 0.9, ansi: bool = True):
        self.tokenizer = tokenizer
        self.puzzle = puzzle
        self.stream = stream or sys.stdout
        self.threshold = threshold
        self.ansi = ansi
        self.first: dict[int, str] = {}  # cell -> the digit it first appeared with
        self.revised: set[int] = set()
        self.shown = False
        self.prompt_seen = False
        self.steps = 0

    def _track(self, cells: str) -> None:
        for i, c in enumerate(cells):
            if c != BLANK and self.puzzle[i] == BLANK and self.first.setdefault(i, c) != c:
                self.revised.add(i)

    def _draw(self, cells: str, caption: str, final: bool = False) -> None:
        if not self.ansi:  # plain text: the steps as lines, the grid once at the end
            grid = render_grid(self.puzzle, cells, color=False) + "\n" if final else ""
            self.stream.write(f"{grid}{caption}\n")
            self.stream.flush()
            return
        if self.shown:
            self.stream.write(f"\x1b[{GRID_LINES + 1}F\x1b[J")  # back to the grid's first line, erase below
        self.stream.write(render_grid(self.puzzle, cells, revised=self.revised) + f"\n{caption}\n")
        self.stream.flush()
        self.shown = True

    def put(self, value) -> None:
        """The prompt first (nothing to draw), then the committed canvas [1, L], drawn in full."""
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        cells = canvas_cells(self.tokenizer, value[0].tolist())
        self._track(cells)
        self._draw(cells, f"done after {self.steps} steps; {len(self.revised)} cells revised", final=True)

    def put_draft(self, value=None, logits=None) -> None:
        if logits is not None:
            cells = confident_cells(self.tokenizer, logits[0], self.threshold)
        elif value is not None:
            cells = canvas_cells(self.tokenizer, value[0].tolist())
        else:
            return
        cells = "".join(p if p != BLANK else c for p, c in zip(self.puzzle, cells))  # givens always show
        self.steps += 1
        self._track(cells)
        blanks = self.puzzle.count(BLANK)
        filled = blanks - cells.count(BLANK)
        self._draw(cells, f"step {self.steps}: {filled}/{blanks} cells, {len(self.revised)} revised")

    def end(self) -> None:
        pass


def fresh_puzzles(count: int, givens: int, seed: int | None) -> list[str]:
    """`count` uniquely solvable puzzles with `givens` givens."""
    rng = random.Random(seed)
    return [make_puzzle(rng, givens)[0] for _ in range(count)]


def solve_one(model, tokenizer, puzzle: str, animate: bool, ansi: bool = True, **generate_kwargs) -> SolveResult:
    streamer = GridAnimator(tokenizer, puzzle, ansi=ansi) if animate else None
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
