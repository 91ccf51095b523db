"""Compile time and speed of the compiled denoising pass (`generate(compile=True)`, modeling/compile.py
`DenoisePass`) against eager, on the benchmark's small model (hidden 256, 6 layers, 16 experts top-4; see
generate_vs_builtin.py).

For each attention backend: the first compiled `generate` call (it includes compilation), the graphs a later call
with more canvases compiles (should be 0), the largest logits difference of one pass to the exact eager pass, then
eager and compiled alternately: one denoising pass (decoder + LM head) and whole `generate` calls (fast sampling,
lock-step, every step run). Medians. Compilation starts from an empty inductor cache unless `--warm-cache`.

    python benchmarks/compile_speed.py --vocab 32768 --threads 2
    python benchmarks/compile_speed.py --vocab 32768 --threads 2 --backends sdpa --batch 4
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

if "--warm-cache" not in sys.argv:  # before torch reads it
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cold_")

import torch
from torch._dynamo.utils import counters

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.modeling.compile import compiled_denoise_pass
from generate_vs_builtin import randomize_, small_config


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--passes", type=int, default=10, help="timed denoising passes per side and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds (one generate call per side each)")
    parser.add_argument("--backends", nargs="+", default=["sdpa", "flex_attention"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--warm-cache", action="store_true", help="reuse inductor's on-disk cache")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, "
          f"threads {torch.get_num_threads()}, inductor cache {'warm' if args.warm_cache else 'cold'}")
    print(f"vocab {args.vocab}, canvas {args.canvas}, prompt {args.prompt}, batch {args.batch}, {args.steps} steps")
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(small_config(args.vocab, args.canvas))
    randomize_(model)
    model.eval()
    B, L, V = args.batch, args.canvas, args.vocab
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (B, args.prompt), generator=g)
    canvas = torch.randint(0, V, (B, L), generator=g)
    kw = dict(sampling="fast", seed=0, max_denoising_steps=args.steps, stability_threshold=args.steps + 1,
              batching="lockstep")

    def generate(new_tokens, compiled):
        return lambda: model.generate(ids, max_new_tokens=new_tokens, compile=compiled, **kw).sequences

    print(f"{'backend':>14} {'part':<36} {'eager s':>8} {'compiled s':>10} {'ratio':>6}  notes")
    for impl in args.backends:
        model.config._attn_implementation = impl
        model.__dict__.pop("_denoise_passes", None)  # compile afresh for this backend
        with torch.no_grad():
            cache = model.new_cache()
            cache.reserve(args.prompt + 2 * L)
            model.encode(ids, cache)
            eager_pass = lambda: model.head(model.denoise(canvas, cache))
            eager_logits = eager_pass()
            eager_tokens = generate(L, False)()
            counters.clear()
            first = timed(generate(L, True))  # compiles, then runs one canvas
            compiled_graphs = counters["stats"]["unique_graphs"]
            same = torch.equal(generate(L, True)(), eager_tokens)
            pass_fn = compiled_denoise_pass(model)
            diff = (pass_fn(canvas, cache) - eager_logits).abs().max().item()
            counters.clear()
            timed(generate(2 * L, True))
            later_graphs = counters["stats"]["unique_graphs"]
            times = {"pass": ([], []), "generate": ([], [])}  # (eager, compiled), alternating
            for _ in range(args.repeats):
                for side, fn in ((0, eager_pass), (1, lambda: pass_fn(canvas, cache))):
                    fn()
                    times["pass"][side].extend(timed(fn) for _ in range(args.passes))
                    times["generate"][side].append(timed(generate(L, bool(side))))
        (ep, cp), (eg, cg) = ([statistics.median(t) for t in pair] for pair in times.values())
        print(f"{impl:>14} {'denoising pass (6 layers + LM head)':<36} {ep:>8.4f} {cp:>10.4f} {ep / cp:>5.2f}x  "
              f"max |logits diff| {diff:.1e}")
        print(f"{impl:>14} {f'generate {L} tokens, {args.steps} steps':<36} {eg:>8.3f} {cg:>10.3f} {eg / cg:>5.2f}x  "
              f"same tokens as eager: {same}")
        print(f"{impl:>14} {'first compiled generate':<36} {'':>8} {first:>10.2f} {'':>6}  "
              f"~{first - cg:.1f} s compiling {compiled_graphs} graph(s)")
        print(f"{impl:>14} {f'then generate {2 * L} tokens (2 canvases)':<36} {'':>8} {'':>10} {'':>6}  "
              f"graphs compiled: {later_graphs}")


if __name__ == "__main__":
    main()
