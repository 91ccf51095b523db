"""Sudoku showcase: the bundled demo model against the same architecture untrained, by difficulty.

For each givens count and each model: exact-solve rate, mean and median denoising steps (adaptive stopping, at most
--max-steps) and wall time, on --puzzles fresh, uniquely solvable puzzles (the same puzzles for both models, drawn
from a seed the training never uses). Prints a side-by-side table, one JSON line per (model, givens), and writes a
PNG plot of solve rate and mean steps against givens when matplotlib is installed (`pip install
diffusiongemma[plot]`).

    python benchmarks/sudoku_showcase.py [--puzzles 50] [--givens 30,36,45,55,65] [--max-steps N] [--model DIR]
                                         [--seed 0] [--plot sudoku_showcase.png] [--no-untrained]
    python benchmarks/sudoku_showcase.py --puzzles 200 --givens 36       # the headline number
    python benchmarks/sudoku_showcase.py --seed 1 --no-untrained --set t_min=0.3 --set entropy_bound=0.2
                                                  # tune sampler settings on other puzzles (seed 1)
"""

import argparse
import json
import platform
import time

import torch
import transformers

from diffusiongemma.generation.config import EntropyBoundSamplerConfig
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.sudoku.demo import fresh_puzzles, load_demo_model
from diffusiongemma.sudoku.solver import solve_puzzles, solve_rate

PUZZLE_SEED = 10_000  # fresh puzzles: training pools use "sudoku-pool-*" seeds, evaluation "sudoku-eval-*"


def run(model, tokenizer, puzzles, batch_size: int, seed: int, **generate_kwargs) -> dict:
    torch.manual_seed(seed)
    solve_puzzles(model, tokenizer, puzzles[:2], max_denoising_steps=2)  # warm-up
    start = time.perf_counter()
    results = []
    for i in range(0, len(puzzles), batch_size):
        results += solve_puzzles(model, tokenizer, puzzles[i : i + batch_size], **generate_kwargs)
    wall = time.perf_counter() - start
    return {**solve_rate(results), "wall_s": round(wall, 2), "ms_per_puzzle": round(1000 * wall / len(puzzles), 1)}


def generation_overrides(settings: list[str], max_steps: int | None) -> dict:
    """`generate` overrides from --set KEY=VALUE items (entropy_bound goes into the sampler config)."""
    overrides = {"max_denoising_steps": max_steps} if max_steps else {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        number = float(value) if any(c in value for c in ".e") else int(value)
        if key == "entropy_bound":
            overrides["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(number))
        else:
            overrides[key] = number
    return overrides


def plot(rows: list[dict], path: str) -> None:
    """Solve rate and mean steps against givens, one line per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install 'diffusiongemma[plot]'); no plot written to {path}")
        return
    fig, (rate_ax, steps_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = sorted((r for r in rows if r["model"] == name), key=lambda r: r["givens"])
        givens = [r["givens"] for r in mine]
        rate_ax.plot(givens, [100 * r["solve_rate"] for r in mine], marker="o", label=name)
        steps_ax.plot(givens, [r["mean_steps"] for r in mine], marker="o", label=name)
    rate_ax.set(xlabel="givens", ylabel="valid solutions (%)", title="Solve rate", ylim=(-2, 102))
    steps_ax.set(xlabel="givens", ylabel="mean denoising steps", title="Denoising steps")
    for ax in (rate_ax, steps_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"DiffusionGemma Sudoku, {rows[0]['count']} fresh puzzles per point")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--puzzles", type=int, default=50, help="puzzles per givens count (default 50)")
    parser.add_argument("--givens", default="30,36,45,55,65", help="comma-separated givens counts")
    parser.add_argument("--max-steps", type=int, default=None, help="denoising step cap (default: the model's)")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled demo model)")
    parser.add_argument("--seed", type=int, default=0, help="offsets the puzzle seed and seeds generation")
    parser.add_argument("--plot", default="sudoku_showcase.png", help="PNG path ('' for none)")
    parser.add_argument("--no-untrained", action="store_true", help="skip the untrained baseline")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a generation setting: t_min, t_max, entropy_bound, confidence_threshold, "
                        "stability_threshold, max_denoising_steps (repeatable)")
    args = parser.parse_args()
    levels = [int(g) for g in args.givens.split(",") if g.strip()]

    cpu = platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {cpu}, "
          f"{torch.get_num_threads()} threads")
    trained, tokenizer = load_demo_model(args.model)
    models = {"trained" if args.model else "trained (bundled)": trained}
    if not args.no_untrained:
        torch.manual_seed(args.seed)
        untrained = DiffusionGemmaForBlockDiffusion(trained.config).eval()  # same architecture, random init
        untrained.generation_config = trained.generation_config
        models["untrained"] = untrained
    overrides = generation_overrides(args.set, args.max_steps)
    cap = overrides.get("max_denoising_steps", trained.generation_config.max_denoising_steps)
    print(f"{args.puzzles} fresh puzzles per givens count, adaptive stopping, at most {cap} steps"
          + (f"; overrides {args.set}" if args.set else ""))
    rows = []
    for givens in levels:
        puzzles = fresh_puzzles(args.puzzles, givens, seed=PUZZLE_SEED + 97 * givens + args.seed)
        for name, model in models.items():
            stats = run(model, tokenizer, puzzles, args.batch_size, args.seed, **overrides)
            rows.append({"model": name, "givens": givens, **stats})
            print(json.dumps(rows[-1]), flush=True)

    names = list(models)
    width = max(16, *(len(n) for n in names))
    print("\n" + " " * 9 + " | ".join(f"{n:^{width}s}" for n in names))
    print(f"{'givens':>6} | " + " | ".join(f"{'solved':>{width - 8}s}   steps" for _ in names))
    for givens in levels:
        cells = []
        for name in names:
            r = next(r for r in rows if r["model"] == name and r["givens"] == givens)
            cells.append(f"{100 * r['solve_rate']:{width - 9}.1f}%  {r['mean_steps']:6.1f}")
        print(f"{givens:>6} | " + " | ".join(cells))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
