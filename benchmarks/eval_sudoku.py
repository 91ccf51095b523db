"""The Sudoku lm-eval tasks (tests/evaluation/tasks) on the bundled model: solve rate and mean denoising passes per
answer for the checkpoint's sampler and every preset, and the multiple-choice accuracy of the ELBO. The tables of
docs/evaluation.md.

    HF_DATASETS_OFFLINE=1 python benchmarks/eval_sudoku.py [--limit 50] [--mc-samples 32] [--threads 1]
"""

import argparse
import platform
import time
from pathlib import Path

import lm_eval
import torch
from lm_eval.tasks import TaskManager

from diffusiongemma.evaluation import DiffusionGemmaLM
from diffusiongemma.generation.sampler_presets import SAMPLER_PRESETS
from diffusiongemma.sudoku.demo import DEMO_MODEL

TASKS = str(Path(__file__).resolve().parents[1] / "tests" / "evaluation" / "tasks")


def run(task: str, limit: int, **model_args) -> tuple[dict, DiffusionGemmaLM, float]:
    lm = DiffusionGemmaLM(pretrained=str(DEMO_MODEL), dtype="float32", device="cpu", batch_size=50, seed=0,
                          **model_args)
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], limit=limit,
                                  task_manager=TaskManager(include_path=TASKS, include_defaults=False))
    return out["results"][task], lm, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--mc-samples", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, lm_eval {lm_eval.__version__ if hasattr(lm_eval, '__version__') else '?'}, "
          f"{platform.processor() or platform.machine()}, {args.threads} thread(s), {args.limit} puzzles")
    print("| sampler | solve rate | ± SE | mean denoising passes per answer | seconds |")
    print("|---|---:|---:|---:|---:|")
    for name in [None, *SAMPLER_PRESETS]:
        extra = {"sampler_preset": name} if name else {}
        res, lm, seconds = run("sudoku_solve", args.limit, **extra)
        passes = sum(lm.generation_passes) / len(lm.generation_passes)
        print(f"| {name or 'checkpoint (entropy bound 0.1)'} | {res['solved,none']:.3f} | "
              f"{res['solved_stderr,none']:.3f} | {passes:.2f} | {seconds:.1f} |", flush=True)
    res, lm, seconds = run("sudoku_choice", args.limit, mc_samples=args.mc_samples)
    se = sum(lm.elbo_standard_errors) / len(lm.elbo_standard_errors)
    print(f"\nsudoku_choice: acc {res['acc,none']:.3f} ± {res['acc_stderr,none']:.3f} over {args.limit} puzzles x 4 "
          f"grids, {args.mc_samples} samples per grid, mean ELBO standard error {se:.2f} nats, {seconds:.1f} s")


if __name__ == "__main__":
    main()
