"""Sudoku showcase: the bundled demo model against the same architecture untrained.

For each model: exact-solve rate, mean and median denoising steps (adaptive stopping, at most --max-steps) and wall
time on --puzzles fresh, uniquely solvable puzzles with --givens givens (the same puzzles for both models).

    python benchmarks/sudoku_showcase.py [--puzzles 200] [--givens 36] [--max-steps 48] [--model DIR] [--seed 0]
"""

import argparse
import json
import platform
import time

import torch
import transformers

from diffusiongemma.modeling import DiffusionGemmaForBlockDiffusion
from diffusiongemma.sudoku.demo import fresh_puzzles, load_demo_model
from diffusiongemma.sudoku.solver import solve_puzzles, solve_rate


def run(model, tokenizer, puzzles, max_steps: int, batch_size: int, seed: int) -> dict:
    torch.manual_seed(seed)
    solve_puzzles(model, tokenizer, puzzles[:2], max_denoising_steps=2)  # warm-up
    start = time.perf_counter()
    results = []
    for i in range(0, len(puzzles), batch_size):
        results += solve_puzzles(model, tokenizer, puzzles[i : i + batch_size], max_denoising_steps=max_steps)
    wall = time.perf_counter() - start
    return {**solve_rate(results), "wall_s": round(wall, 2), "ms_per_puzzle": round(1000 * wall / len(puzzles), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--puzzles", type=int, default=200)
    parser.add_argument("--givens", type=int, default=36)
    parser.add_argument("--max-steps", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled demo model)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {cpu}, {threads} threads")
    puzzles = fresh_puzzles(args.puzzles, args.givens, seed=10_000 + args.seed)
    trained, tokenizer = load_demo_model(args.model)
    torch.manual_seed(args.seed)
    untrained = DiffusionGemmaForBlockDiffusion(trained.config).eval()  # same architecture, random init
    untrained.generation_config = trained.generation_config
    print(f"{args.puzzles} puzzles with {args.givens} givens, adaptive stopping, at most {args.max_steps} steps")
    for name, model in (("trained (bundled)", trained), ("untrained", untrained)):
        stats = run(model, tokenizer, puzzles, args.max_steps, args.batch_size, args.seed)
        print(f"{name:18s} solved {stats['solve_rate']:6.1%}  steps mean {stats['mean_steps']:5.1f} "
              f"median {stats['median_steps']:5.1f}  wall {stats['wall_s']:7.2f}s ({stats['ms_per_puzzle']} ms/puzzle)")
        print(json.dumps({"model": name, "givens": args.givens, **stats}))


if __name__ == "__main__":
    main()
