"""Solve Sudoku puzzles with a DiffusionGemma checkpoint: prompt building, batched `generate`, scoring.

Shared by the demo command, the training recipe's evaluation and the showcase benchmark.

Legend: B batch (puzzles), P prompt length (83), L canvas length.
"""

from dataclasses import dataclass

import torch

from .puzzles import is_solved
from .tokenizer import decode_solution, encode_puzzle


@dataclass
class SolveResult:
    """One solved (or not) puzzle.

    Attributes:
        puzzle: the 81-character puzzle.
        solution: the 81 characters the model wrote (shorter if it wrote fewer digits).
        valid: `solution` is a complete valid grid that agrees with the puzzle's givens.
        steps: denoising passes spent on the canvas.
    """

    puzzle: str
    solution: str
    valid: bool
    steps: int


def denoising_passes(new_tokens: torch.Tensor, tokens_per_forward: torch.Tensor, pad_id: int) -> list[int]:
    """Passes per row recovered from `generate`'s tokens_per_forward = (# non-pad new tokens) / passes (spec D.6)."""
    counted = (new_tokens != pad_id).sum(dim=1).float()  # [B]
    return [int(round(c / t)) if t > 0 else 0 for c, t in zip(counted.tolist(), tokens_per_forward.tolist())]


@torch.no_grad()
def solve_puzzles(model, tokenizer, puzzles: list[str], streamer=None, **generate_kwargs) -> list[SolveResult]:
    """Denoise one canvas per puzzle in one batch.

    Args:
        model: a `DiffusionGemmaForBlockDiffusion` trained on Sudoku (its generation config supplies the settings).
        tokenizer: `sudoku_tokenizer()`.
        puzzles: 81-character puzzles.
        streamer: optional, batch 1 only (e.g. for the animation).
        generate_kwargs: overrides of generation settings (e.g. `max_denoising_steps`).
    Returns:
        one `SolveResult` per puzzle, in order.
    """
    input_ids = torch.tensor([encode_puzzle(tokenizer, p) for p in puzzles], device=model.device)  # [B, P]
    out = model.generate(
        input_ids, max_new_tokens=model.canvas_length, streamer=streamer, return_dict_in_generate=True,
        **generate_kwargs,
    )
    new = out.sequences[:, input_ids.shape[1]:]  # [B, L]
    steps = denoising_passes(new, out.tokens_per_forward, tokenizer.pad_token_id)
    results = []
    for puzzle, row, n in zip(puzzles, new.tolist(), steps):
        solution = decode_solution(tokenizer, row)
        results.append(SolveResult(puzzle, solution, is_solved(puzzle, solution), n))
    return results


def solve_rate(results: list[SolveResult]) -> dict:
    """Summary of results: solve_rate, mean_steps, median_steps, count."""
    steps = sorted(r.steps for r in results)
    n = len(results)
    median = (steps[(n - 1) // 2] + steps[n // 2]) / 2 if n else 0.0
    return {
        "solve_rate": sum(r.valid for r in results) / n if n else 0.0,
        "mean_steps": sum(steps) / n if n else 0.0,
        "median_steps": median,
        "count": n,
    }
