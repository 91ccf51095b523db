"""Constrained denoising on the bundled Sudoku model: fresh puzzles with and without a regex that pins the givens
and allows only digits elsewhere, and the two ways to project (the argmax canvas only, or the step's logits too, so
the next decoder input and self-conditioning stay inside the constraint: `ConstraintGuide.project_canvas`).

Exact-solve rate, mean denoising steps and wall time per setting, on the same puzzles and the same global seed
(reference sampling). Medians are not needed: one pass over the puzzles is the measurement.

    python benchmarks/sudoku_constraints.py --puzzles 200 --givens 36 --threads 1
"""

import argparse
import functools
import json
import platform
import time
from unittest import mock

import torch

from diffusiongemma import Regex
from diffusiongemma.constraints.guide import ConstraintGuide
from diffusiongemma.sudoku.demo import fresh_puzzles, load_demo_model
from diffusiongemma.sudoku.puzzles import is_solved
from diffusiongemma.sudoku.solver import SolveResult, denoising_passes, solve_puzzles, solve_rate
from diffusiongemma.sudoku.tokenizer import decode_solution, encode_puzzle

PUZZLE_SEED = 20_000  # fresh puzzles, a seed neither training nor the other showcase uses


def givens_regex(puzzle: str) -> str:
    """Each given digit pinned, every blank any digit: 81 characters (the EOS after them is the automaton's)."""
    return "".join(c if c in "123456789" else "[1-9]" for c in puzzle)


@torch.no_grad()
def solve_constrained(model, tokenizer, puzzle: str) -> SolveResult:
    ids = torch.tensor([encode_puzzle(tokenizer, puzzle)])
    out = model.generate(ids, max_new_tokens=model.canvas_length, constraint=Regex(givens_regex(puzzle)),
                         tokenizer=tokenizer)
    new = out.sequences[:, ids.shape[1]:]
    solution = decode_solution(tokenizer, new[0].tolist())
    steps = denoising_passes(new, out.tokens_per_forward, tokenizer.pad_token_id)[0]
    return SolveResult(puzzle, solution, is_solved(puzzle, solution), steps)


def run(model, tokenizer, puzzles, batch_size, seed, constrained: bool, project_canvas: bool = True) -> dict:
    torch.manual_seed(seed)
    start = time.perf_counter()
    results = []
    guide = functools.partial(ConstraintGuide, project_canvas=project_canvas)
    with mock.patch("diffusiongemma.generation.plan.ConstraintGuide", guide):
        for i in range(0, len(puzzles), batch_size):
            batch = puzzles[i : i + batch_size]
            if constrained:  # one regex per puzzle: one generate call per puzzle (a call takes one constraint)
                results += [solve_constrained(model, tokenizer, p) for p in batch]
            else:  # one call per puzzle too, so every setting draws its random numbers the same way
                results += [r for p in batch for r in solve_puzzles(model, tokenizer, [p])]
    wall = time.perf_counter() - start
    return {**solve_rate(results), "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--puzzles", type=int, default=200)
    parser.add_argument("--givens", type=int, default=36)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_demo_model()
    puzzles = fresh_puzzles(args.puzzles, args.givens, PUZZLE_SEED)
    print(f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} thread(s); {args.puzzles} "
          f"puzzles with {args.givens} givens, reference sampling, seed {args.seed}")
    settings = [("unconstrained", dict(constrained=False)),
                ("regex, argmax canvas projected", dict(constrained=True, project_canvas=False)),
                ("regex, logits projected too", dict(constrained=True, project_canvas=True))]
    for name, kwargs in settings:
        row = run(model, tokenizer, puzzles, args.batch_size, args.seed, **kwargs)
        print(f"{name:34s} solve rate {row['solve_rate']:.3f}  mean steps {row['mean_steps']:.1f}  "
              f"median {row['median_steps']:.1f}  wall {row['wall_s']} s")
        print(json.dumps({"setting": name, **row}))


if __name__ == "__main__":
    main()
