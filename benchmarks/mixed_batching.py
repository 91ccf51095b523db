"""Mixed-phase vs lock-step batching in fast mode, on the bundled Sudoku demo model (rows converge at different steps).

Both runs solve the same puzzles with the same per-row seeds and at most `--batch` rows per forward:
- lock-step: consecutive groups of `--batch` puzzles; a group denoises until its slowest row stops, finished rows
  stay in the batch (`batching="lockstep", max_batch_size=B`);
- mixed: a pool of `--batch` rows; a row that converged leaves at once and the next puzzle is prefilled in the same
  forward as the others' denoising (`batching="mixed", max_batch_size=B`).
Every row must give the same solution both ways (asserted). Prints median wall time over alternating runs,
throughput (puzzles/s) and the ratio mixed / lock-step.

    python benchmarks/mixed_batching.py [--puzzles 32] [--givens 36] [--batch 4] [--repeats 3] [--threads N]
"""

import argparse
import json
import platform
import statistics
import time

import torch
import transformers

from diffusiongemma.sudoku.demo import fresh_puzzles, load_demo_model
from diffusiongemma.sudoku.puzzles import is_solved
from diffusiongemma.sudoku.tokenizer import decode_solution, encode_puzzle


def solve(model, input_ids, batching: str, batch: int, seed: int, max_steps: int | None):
    start = time.perf_counter()
    cap = {"max_denoising_steps": max_steps} if max_steps else {}  # default: the model's generation_config
    out = model.generate(input_ids, sampling="fast", seed=seed, batching=batching, max_batch_size=batch,
                         return_dict_in_generate=True, **cap)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--puzzles", type=int, default=32)
    # 36 givens: the shipped demo model stops rows after 3 to 32 steps (at 45 nearly all stop after 2-4)
    parser.add_argument("--givens", type=int, default=36)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=None, help="step cap (default: the model's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled demo model)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_demo_model(args.model)
    puzzles = fresh_puzzles(args.puzzles, args.givens, seed=args.seed)
    input_ids = torch.tensor([encode_puzzle(tokenizer, p) for p in puzzles])  # [N, P]
    solve(model, input_ids[:2], "mixed", 2, 0, 2)  # warm-up
    times = {"lockstep": [], "mixed": []}
    outs = {}
    for _ in range(args.repeats):
        for batching in ("lockstep", "mixed"):
            wall, outs[batching] = solve(model, input_ids, batching, args.batch, args.seed, args.max_steps)
            times[batching].append(wall)
    same = torch.equal(outs["lockstep"].sequences, outs["mixed"].sequences)
    assert same, "mixed and lock-step batching gave different solutions"
    P = input_ids.shape[1]
    new = outs["mixed"].sequences[:, P:]
    solved = sum(is_solved(p, decode_solution(tokenizer, row)) for p, row in zip(puzzles, new.tolist()))
    passes = (new != tokenizer.pad_token_id).sum(-1) / outs["mixed"].tokens_per_forward
    lock, mixed = statistics.median(times["lockstep"]), statistics.median(times["mixed"])
    print(json.dumps({
        "torch": torch.__version__, "transformers": transformers.__version__, "cpu": platform.processor(),
        "threads": torch.get_num_threads(), "puzzles": args.puzzles, "givens": args.givens, "batch": args.batch,
        "solved": solved, "denoising_steps": {"mean": round(passes.mean().item(), 2), "min": int(passes.min()),
                                              "max": int(passes.max())},
        "identical_solutions": same,
        "lockstep_s": round(lock, 3), "mixed_s": round(mixed, 3),
        "puzzles_per_s": {"lockstep": round(args.puzzles / lock, 2), "mixed": round(args.puzzles / mixed, 2)},
        "mixed_over_lockstep_throughput": round(lock / mixed, 2),
    }, indent=1))


if __name__ == "__main__":
    main()
