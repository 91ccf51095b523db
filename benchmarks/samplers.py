"""Which sampler to use, measured: solve rate against mean denoising passes per puzzle on the bundled Sudoku model,
for each sampler and a small grid of its settings, plus tokens per forward on a tiny random text model.

Every setting solves the same fresh, uniquely solvable puzzles (drawn from a seed training never uses) with
`sampling="fast"` and the same seed; the stopper and the temperature schedule are the model's generation config.
Prints one JSON line per setting, a table with the Pareto-optimal settings marked, the preset each sampler's rule
picks (diffusiongemma/generation/sampler_presets.py: within one standard error of the sampler's best solve rate,
then the fewest mean passes) next to the shipped one, and (with matplotlib) a plot.

    python benchmarks/samplers.py [--puzzles 200] [--givens 36] [--seed 0] [--plot docs/images/samplers.png]
"""

import argparse
import json
import platform
import time

import math

import torch
import transformers

from diffusiongemma import (
    SAMPLER_PRESETS,
    BlockRefinementSamplerConfig,
    ConfidenceThresholdSamplerConfig,
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    DiscreteDDIMSamplerConfig,
    EntropyBoundSamplerConfig,
)
from diffusiongemma.accuracy.stats import t_cdf
from diffusiongemma.sudoku.demo import fresh_puzzles, load_demo_model
from diffusiongemma.sudoku.solver import solve_puzzles, solve_rate

PUZZLE_SEED = 10_000  # as benchmarks/sudoku_showcase.py: fresh puzzles
SHIPPED = "entropy_bound=0.1"  # the bundled model's generation_config.json
GRID = [
    ("entropy-bound", EntropyBoundSamplerConfig(entropy_bound=0.05)),
    ("entropy-bound", EntropyBoundSamplerConfig(entropy_bound=0.1)),  # the shipped Sudoku setting
    ("entropy-bound", EntropyBoundSamplerConfig(entropy_bound=0.2)),
    ("entropy-bound", EntropyBoundSamplerConfig(entropy_bound=0.5)),
    ("entropy-bound", EntropyBoundSamplerConfig(entropy_bound=1.0)),
    ("block-refinement", BlockRefinementSamplerConfig(threshold=0.95)),
    ("block-refinement", BlockRefinementSamplerConfig(threshold=0.9)),
    ("block-refinement", BlockRefinementSamplerConfig(threshold=0.7)),
    ("block-refinement", BlockRefinementSamplerConfig(threshold=0.5)),
    ("block-refinement", BlockRefinementSamplerConfig(threshold=0.95, greedy=True)),
    ("block-refinement", BlockRefinementSamplerConfig(threshold=0.7, greedy=True)),
    ("block-refinement", BlockRefinementSamplerConfig(threshold=0.9, editing_threshold=0.95)),
    ("confidence-threshold", ConfidenceThresholdSamplerConfig(threshold=0.95)),
    ("confidence-threshold", ConfidenceThresholdSamplerConfig(threshold=0.9)),
    ("confidence-threshold", ConfidenceThresholdSamplerConfig(threshold=0.7)),
    ("confidence-threshold", ConfidenceThresholdSamplerConfig(threshold=0.5)),
    ("confidence-threshold", ConfidenceThresholdSamplerConfig(factor=0.5)),
    ("confidence-threshold", ConfidenceThresholdSamplerConfig(factor=1.0)),
    ("confidence-threshold", ConfidenceThresholdSamplerConfig(factor=2.0)),
    ("discrete-ddim", DiscreteDDIMSamplerConfig()),
    ("discrete-ddim", DiscreteDDIMSamplerConfig(greedy=True)),
    ("discrete-ddim", DiscreteDDIMSamplerConfig(corrector_steps=1, corrector_k=4)),
    ("discrete-ddim", DiscreteDDIMSamplerConfig(corrector_steps=2, corrector_k=8)),
]


def settings_of(config) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.to_dict().items() if k != "_cls_name")


def pareto(rows: list[dict]) -> None:
    """Mark rows no other row beats on both axes (higher solve rate, fewer passes)."""
    for r in rows:
        r["pareto"] = not any(o["solve_rate"] >= r["solve_rate"] and o["mean_steps"] <= r["mean_steps"]
                              and (o["solve_rate"], -o["mean_steps"]) != (r["solve_rate"], -r["mean_steps"])
                              for o in rows)


def standard_error(row: dict) -> float:
    p, n = row["solve_rate"], row["count"]
    return math.sqrt(p * (1 - p) / n)


def pick_presets(rows: list[dict]) -> dict[str, dict]:
    """Per sampler: the settings within one standard error of its best solve rate, then the fewest mean passes."""
    picked = {}
    for name in dict.fromkeys(r["sampler"] for r in rows):
        mine = [r for r in rows if r["sampler"] == name]
        best = max(mine, key=lambda r: r["solve_rate"])
        close = [r for r in mine if r["solve_rate"] >= best["solve_rate"] - standard_error(best)]
        picked[name] = min(close, key=lambda r: (r["mean_steps"], -r["solve_rate"]))
    return picked


def sudoku_rows(puzzles: list[str], seed: int, batch: int) -> list[dict]:
    model, tokenizer = load_demo_model()
    solve_puzzles(model, tokenizer, puzzles[:2], max_denoising_steps=2)  # warm-up
    rows = []
    for name, config in GRID:
        start = time.perf_counter()
        results = []
        for i in range(0, len(puzzles), batch):
            results += solve_puzzles(model, tokenizer, puzzles[i : i + batch], sampler_config=config,
                                     sampling="fast", seed=seed + i)
        row = {"sampler": name, "settings": settings_of(config), **solve_rate(results),
               "wall_s": round(time.perf_counter() - start, 2)}
        print(json.dumps(row), flush=True)
        row["per_puzzle"] = [(r.valid, r.steps) for r in results]  # for the paired tests, not printed
        rows.append(row)
    pareto(rows)
    return rows


def paired_against(row: dict, shipped: dict) -> tuple[float, float]:
    """One-sided p-values that `row` solves more puzzles (exact McNemar: of the puzzles only one of them solves,
    how many are row's) and needs fewer passes (paired t on the same puzzles) than `shipped`."""
    pairs = list(zip(row["per_puzzle"], shipped["per_puzzle"]))
    wins = sum(a and not b for (a, _), (b, _) in pairs)
    losses = sum(b and not a for (a, _), (b, _) in pairs)
    n = wins + losses
    p_solve = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n if n else 1.0
    d = [s_steps - r_steps for (_, r_steps), (_, s_steps) in pairs]  # > 0: row needs fewer
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    if var == 0:
        return p_solve, 0.0 if mean > 0 else 1.0
    return p_solve, 1 - t_cdf(mean / math.sqrt(var / len(d)), len(d) - 1)


def tokens_per_forward_rows(seed: int) -> list[dict]:
    """Tokens per denoising pass on a tiny random text model (LM head sharpened), 8 fixed prompts, 2 canvases each,
    at most 16 steps per canvas. A random model's tokens stay uncertain, so the stopper's confidence threshold is
    1.0 (mean entropy below 1 nat, argmax stable for one step) instead of the default 0.005, which it never meets."""
    text = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, num_experts=4,
                top_k_experts=2, moe_intermediate_size=32, sliding_window=64, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=text, vision_config=None,
                                                                 canvas_length=32)).eval()
    with torch.no_grad():  # sharp logits, so canvases converge and stop at different steps (as a trained model's)
        model.lm_head.weight.mul_(30)
    prompts = torch.randint(3, 512, (8, 12), generator=torch.Generator().manual_seed(1))
    rows = []
    for name, config in GRID:
        out = model.generate(prompts, sampler_config=config, sampling="fast", seed=seed, max_new_tokens=64,
                             max_denoising_steps=16, eos_token_id=None, pad_token_id=0, confidence_threshold=1.0)
        rows.append({"sampler": name, "settings": settings_of(config),
                     "tokens_per_forward": round(float(out.tokens_per_forward.float().mean()), 2)})
    return rows


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(matplotlib not installed: no plot written to {path})")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["sampler"] for r in rows):
        mine = [r for r in rows if r["sampler"] == name]
        ax.scatter([r["mean_steps"] for r in mine], [r["solve_rate"] for r in mine], label=name)
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["mean_steps"])
    ax.plot([r["mean_steps"] for r in front], [r["solve_rate"] for r in front], "k--", lw=1, label="Pareto front")
    ax.set_xlabel("mean denoising passes per puzzle")
    ax.set_ylabel("solve rate")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--puzzles", type=int, default=200)
    p.add_argument("--givens", type=int, default=36)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--plot", default=None)
    p.add_argument("--only", default=None, help="comma-separated row numbers of the grid to run (0-based)")
    args = p.parse_args()
    if args.only:
        GRID[:] = [GRID[int(i)] for i in args.only.split(",")]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.processor() or 'cpu'}, "
          f"{torch.get_num_threads()} threads; {args.puzzles} puzzles with {args.givens} givens")
    rows = sudoku_rows(fresh_puzzles(args.puzzles, args.givens, PUZZLE_SEED), args.seed, args.batch)
    tpf = {(r["sampler"], r["settings"]): r["tokens_per_forward"] for r in tokens_per_forward_rows(args.seed)}
    picked = pick_presets(rows)
    shipped = next((r for r in rows if r["sampler"] == "entropy-bound" and r["settings"] == SHIPPED), None)
    print("\n| sampler | settings | solve rate (± SE) | mean passes | median passes | tokens/forward (tiny text) | "
          "Pareto | preset | p better solve / fewer passes than shipped |")
    print("|---|---|---|---|---|---|---|---|---|")
    beats = []
    for r in rows:
        paired = "shipped" if r is shipped else "-"
        if shipped is not None and r is not shipped:
            p_solve, p_passes = paired_against(r, shipped)
            paired = f"{p_solve:.2g} / {p_passes:.2g}"
            if p_solve < 0.05 and p_passes < 0.05:
                beats.append(r)
        print(f"| {r['sampler']} | {r['settings']} | {r['solve_rate']:.3f} ± {standard_error(r):.3f} | "
              f"{r['mean_steps']:.2f} | {r['median_steps']:.1f} | {tpf[r['sampler'], r['settings']]:.2f} | "
              f"{'yes' if r['pareto'] else ''} | {'yes' if picked[r['sampler']] is r else ''} | {paired} |")
    print("settings that beat the shipped Sudoku setting on both axes (paired one-sided p < 0.05 on each): "
          + (", ".join(f"{r['sampler']} {r['settings']}" for r in beats) or "none"))
    for name, r in picked.items():
        preset = SAMPLER_PRESETS.get(name)
        ours = settings_of(preset) if preset is not None else "none"
        print(f"preset {name}: {r['settings']} ({'as shipped' if ours == r['settings'] else 'shipped: ' + ours})")
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
