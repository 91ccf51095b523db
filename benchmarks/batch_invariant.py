"""Throughput of mixed `generate` in batch-invariant mode against the default mode, on the bundled Sudoku demo model.

For each prompt count N (default 8 and 64) both modes solve the same N puzzles with the same per-row seeds in a pool
of `--batch` rows (`batching="mixed", max_batch_size=B`), alternating over `--repeats` runs; prints the median wall
time, puzzles/s and the invariant / default throughput ratio. It also checks the guarantee on the first `--check`
rows: each batched invariant row must equal its solo invariant run bit for bit (asserted), and it counts the rows
whose default-mode tokens differ from their solo default run (reported, not asserted).

    python benchmarks/batch_invariant.py [--prompts 8 64] [--batch 16] [--givens 36] [--repeats 2] [--check 4]
                                         [--threads N]
"""

import argparse
import json
import platform
import statistics
import time

import torch
import transformers

from diffusiongemma.sudoku.demo import fresh_puzzles, load_demo_model
from diffusiongemma.sudoku.tokenizer import encode_puzzle


def solve(model, input_ids, seeds, batch: int, invariant: bool, max_steps):
    cap = {"max_denoising_steps": max_steps} if max_steps else {}
    start = time.perf_counter()
    out = model.generate(input_ids, sampling="fast", seed=seeds, batching="mixed", max_batch_size=batch,
                         batch_invariant=invariant, **cap)
    return time.perf_counter() - start, out.sequences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--givens", type=int, default=36)
    parser.add_argument("--max-steps", type=int, default=None, help="step cap (default: the model's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--check", type=int, default=4, help="rows compared with their solo runs")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_demo_model()
    rows = []
    for n in args.prompts:
        puzzles = fresh_puzzles(n, args.givens, seed=n)
        ids = torch.tensor([encode_puzzle(tokenizer, p) for p in puzzles])  # [N, P]
        seeds = list(range(n))
        solve(model, ids[:2], seeds[:2], 2, True, 2)  # warm-up
        times, outs = {False: [], True: []}, {}
        for _ in range(args.repeats):
            for invariant in (False, True):
                wall, outs[invariant] = solve(model, ids, seeds, args.batch, invariant, args.max_steps)
                times[invariant].append(wall)
        differ = 0
        for r in range(min(args.check, n)):
            for invariant in (False, True):
                _, alone = solve(model, ids[r : r + 1], [seeds[r]], 1, invariant, args.max_steps)
                same = torch.equal(outs[invariant][r, : alone.shape[1]], alone[0])
                if invariant:
                    assert same, f"row {r}: the batch-invariant run differs from its solo run"
                differ += not same and not invariant
        default, invariant = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"prompts": n, "default_s": round(default, 3), "invariant_s": round(invariant, 3),
                     "puzzles_per_s": {"default": round(n / default, 2), "invariant": round(n / invariant, 2)},
                     "invariant_over_default_throughput": round(default / invariant, 2),
                     "checked_rows": min(args.check, n), "default_rows_differing_from_solo": differ})
    print(json.dumps({
        "torch": torch.__version__, "transformers": transformers.__version__, "cpu": platform.processor(),
        "threads": torch.get_num_threads(), "batch": args.batch, "givens": args.givens, "repeats": args.repeats,
        "results": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
