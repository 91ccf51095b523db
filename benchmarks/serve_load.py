"""Load test of `diffusiongemma serve` on the bundled Sudoku demo model, loopback only.

Starts the server in this process on 127.0.0.1 (a free port), then for each concurrency level C runs C client threads
(the official `openai` client), each sending streaming `/v1/completions` requests with `stream_drafts` one after the
other until `--requests` requests are done. Per request it records the time to the first draft, to the first committed
content and to the end of the response. Prints, per level: throughput (requests/s, committed tokens/s, and the
speed-up over C = 1), latency percentiles (p50 / p90 / p99) and the solve rate (a check that the answers are real),
then versions and hardware.

    python benchmarks/serve_load.py [--levels 1 4 16] [--requests 32] [--givens 36] [--max-batch-size 16]
                                    [--threads N] [--timeout 600] [--device cpu] [--dtype float32]
                                    [--modes default batch-invariant compile compile-reduce-overhead]
                                    [--batch-invariant] [--compile]

--modes runs one server per mode, one after another, and prints one table (a `mode` column) to compare them:
"batch-invariant" serves with `diffusiongemma serve --batch-invariant` (every request alone inside each pass),
"compile" with `--compile` (compiled row passes), "compile-reduce-overhead" with `--compile-mode reduce-overhead`
(CUDA graphs; CUDA only). A compiled server's warm-up also runs w clients at once for every row bucket w up to the
largest level (at most --max-batch-size), so the buckets compile before the measurement; each mode's warm-up time
is printed.
--batch-invariant is short for `--modes batch-invariant`, --compile for `--modes default compile`.
"""

import argparse
import math
import os
import platform
import sys
import threading
import time

import openai
import torch
import transformers

from diffusiongemma.modeling.compile import row_bucket
from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app
from diffusiongemma.sudoku.demo import fresh_puzzles
from diffusiongemma.sudoku.puzzles import is_solved
from diffusiongemma.sudoku.tokenizer import encode_puzzle

DEMO_MODEL = os.path.join(os.path.dirname(__import__("diffusiongemma.sudoku", fromlist=["x"]).__file__), "demo_model")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in (0, 100]): the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def one_request(client, model: str, prompt: str, seed: int) -> dict:
    start = time.perf_counter()
    first_draft = first_commit = None
    text, tokens = [], 0
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=82, seed=seed, stream=True,
                                       extra_body={"stream_drafts": True})
    for chunk in stream:
        now = time.perf_counter() - start
        if (chunk.model_extra or {}).get("draft") and first_draft is None:
            first_draft = now
        if chunk.choices and chunk.choices[0].text:
            first_commit = first_commit if first_commit is not None else now
            text.append(chunk.choices[0].text)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return {"draft": first_draft, "commit": first_commit, "total": time.perf_counter() - start,
            "tokens": tokens, "text": "".join(text)}


def run_level(client, model: str, prompts: list[tuple[str, str]], clients: int) -> dict:
    results, lock = [], threading.Lock()
    todo = list(enumerate(prompts))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i, (puzzle, prompt) = todo.pop()
            r = one_request(client, model, prompt, seed=i)
            r["solved"] = is_solved(puzzle, r["text"][:81])
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"wall": wall, "results": results}


MODES = {  # mode -> the ServeOptions it changes (`diffusiongemma serve` flags in the comments)
    "default": {},
    "batch-invariant": {"batch_invariant": True},  # --batch-invariant
    "compile": {"compile": True},  # --compile
    "compile-reduce-overhead": {"compile": {"mode": "reduce-overhead"}},  # --compile-mode reduce-overhead (CUDA)
}


def serve_mode(args, mode: str, prompts_of) -> tuple[float, list]:
    """Start a server in `mode`, warm it up, run every level; (warm-up seconds, [(clients, wall, results)])."""
    served = build_app(ServeOptions(model=args.model, device=args.device, dtype=args.dtype, max_model_len=256,
                                    max_batch_size=args.max_batch_size, max_queue=max(args.levels) * 2,
                                    **MODES[mode]))
    server = BackgroundServer(served.app).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=args.timeout, max_retries=0)
    prompts = prompts_of(served.tokenizer)
    try:
        start = time.perf_counter()
        run_level(client, args.model, prompts[:2], 2)
        if MODES[mode].get("compile"):  # every row bucket up to the largest level compiles here, not while measured:
            # w clients at once share passes of w rows (bucket w) as they start, fewer as they finish
            width = min(max(args.levels), args.max_batch_size)
            for w in sorted({row_bucket(n, args.max_batch_size) for n in range(1, width + 1)}):
                run_level(client, args.model, prompts[:w], w)
        warm = time.perf_counter() - start
        rows = []
        for clients in args.levels:
            level = run_level(client, args.model, prompts, clients)
            rows.append((clients, level["wall"], level["results"]))
    finally:
        server.stop()
        served.state.shutdown()
    return warm, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=32, help="requests per level")
    # 36 givens: requests need 3 to 32 denoising steps with the shipped demo model (at 45 nearly all need 2-4)
    parser.add_argument("--givens", type=int, default=36)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--timeout", type=float, default=600, help="per-request client timeout, seconds")
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--device", default="cpu", help="torch device of the server (default cpu)")
    parser.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=None,
                        help="server modes to run one after another, each its own server (default: default)")
    parser.add_argument("--batch-invariant", action="store_true", help="shorthand for --modes batch-invariant")
    parser.add_argument("--compile", action="store_true", help="shorthand for --modes default compile")
    args = parser.parse_args()
    modes = args.modes or (["batch-invariant"] if args.batch_invariant else []) + (
        ["default", "compile"] if args.compile else []) or ["default"]
    if args.threads:
        torch.set_num_threads(args.threads)
    puzzles = fresh_puzzles(args.requests, args.givens, seed=0)
    prompts_of = lambda tokenizer: [(p, tokenizer.decode(encode_puzzle(tokenizer, p))) for p in puzzles]  # noqa: E731
    runs = [(mode, *serve_mode(args, mode, prompts_of)) for mode in modes]
    print("| mode | clients | req/s | tokens/s | vs 1 client | first draft p50/p90/p99 (s) "
          "| first commit p50/p90/p99 (s) | full response p50/p90/p99 (s) | solved |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, _, rows in runs:
        base_rate = None
        for clients, wall, rs in rows:
            rate = len(rs) / wall
            base_rate = base_rate or rate
            tokens = sum(r["tokens"] for r in rs) / wall

            def pct(key):
                values = [r[key] for r in rs if r[key] is not None]
                return "/".join(f"{percentile(values, q):.2f}" for q in (50, 90, 99)) if values else "-"

            solved = sum(r["solved"] for r in rs)
            print(f"| {mode} | {clients} | {rate:.2f} | {tokens:.0f} | {rate / base_rate:.2f}x | {pct('draft')} "
                  f"| {pct('commit')} | {pct('total')} | {solved}/{len(rs)} |")
    for mode, warm, _ in runs:
        print(f"serve load {mode}: warm-up {warm:.1f} s" + (" (includes compiling every row bucket)"
                                                               if MODES[mode].get("compile") else ""))
    print(f"\n{args.requests} streaming /v1/completions requests per level (stream_drafts, max_tokens 82, one canvas),"
          f" max_batch_size {args.max_batch_size}, puzzles with {args.givens} givens; model {args.model} on "
          f"{args.device} ({args.dtype})")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, openai {openai.__version__}, "
          f"python {sys.version.split()[0]}, {platform.machine()} {platform.processor() or platform.platform()}, "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, one run per level")


if __name__ == "__main__":
    main()
