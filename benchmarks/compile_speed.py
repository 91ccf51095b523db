"""Compile time and speed of `compile_layers` (torch.compile of the decoder layers) against eager, on the benchmark's
small model (hidden 256, 6 layers, 16 experts top-4; see generate_vs_builtin.py).

For each attention backend, on one model: the first compiled `generate` call (it includes compilation), the graphs a
later call with more canvases compiles (should be 0), the largest logits difference to eager, then eager and compiled
alternately (`compile_layers` / `uncompile_layers`, no recompilation): a decoder pass over the canvas, the per-step
work that compiles, and whole `generate` calls (fast sampling, every step run). Medians. Compilation starts from an
empty inductor cache unless `--warm-cache` (then a cache from an earlier run is reused).

    python benchmarks/compile_speed.py --vocab 32768 --threads 1
    python benchmarks/compile_speed.py --vocab 32768 --threads 1 --backends sdpa --batch 4
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
from torch._inductor.compile_fx import compile_fx

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.modeling.compile import compile_layers, uncompile_layers
from generate_vs_builtin import randomize_, small_config


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


GRAPHS = []


def counting_inductor(gm, example_inputs):
    """Inductor, counting the graphs of the compiled pieces (not torch's own internal compiles)."""
    GRAPHS.append(gm)
    return compile_fx(gm, example_inputs)


def graphs() -> int:
    return len(GRAPHS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--passes", type=int, default=10, help="timed decoder passes per side and repeat")
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
    kw = dict(sampling="fast", seed=0, max_denoising_steps=args.steps, stability_threshold=args.steps + 1)

    def decoder_pass(cache):
        return lambda: model.denoise(canvas, cache)

    def generate(new_tokens):
        return lambda: model.generate(ids, max_new_tokens=new_tokens, **kw).sequences

    print(f"{'backend':>14} {'part':<36} {'eager s':>8} {'compiled s':>10} {'ratio':>6}  notes")
    for impl in args.backends:
        model.config._attn_implementation = impl
        uncompile_layers(model)
        with torch.no_grad():
            cache = model.new_cache()
            cache.reserve(args.prompt + 2 * L)
            model.encode(ids, cache)
            eager_logits = model.head(model.denoise(canvas, cache))
            eager_tokens = generate(L)()

            compile_layers(model, backend=counting_inductor)
            before = graphs()
            first = timed(generate(L))  # compiles (during the first canvas) and runs one canvas
            compiled_graphs = graphs() - before
            same = torch.equal(generate(L)(), eager_tokens)
            diff = (model.head(model.denoise(canvas, cache)) - eager_logits).abs().max().item()
            before = graphs()
            timed(generate(2 * L))
            later_graphs = graphs() - before

            times = {"pass": ([], []), "generate": ([], [])}  # (eager, compiled), alternating
            for _ in range(args.repeats):
                for side in (0, 1):
                    if side:
                        compile_layers(model, backend=counting_inductor)  # the graphs are cached: nothing compiles
                    else:
                        uncompile_layers(model)
                    timed(decoder_pass(cache))
                    times["pass"][side].extend(timed(decoder_pass(cache)) for _ in range(args.passes))
                    times["generate"][side].append(timed(generate(L)))
            assert graphs() == before + later_graphs, "toggling compile_layers recompiled"
        (ep, cp), (eg, cg) = ([statistics.median(t) for t in pair] for pair in times.values())
        print(f"{impl:>14} {'decoder pass (6 layers, no LM head)':<36} {ep:>8.4f} {cp:>10.4f} {ep / cp:>5.2f}x  "
              f"max |logits diff| {diff:.1e}")
        print(f"{impl:>14} {f'generate {L} tokens, {args.steps} steps':<36} {eg:>8.3f} {cg:>10.3f} {eg / cg:>5.2f}x  "
              f"same tokens as eager: {same}")
        print(f"{impl:>14} {'first compiled generate':<36} {'':>8} {first:>10.2f} {'':>6}  "
              f"~{first - cg:.1f} s compiling {compiled_graphs} graphs")
        print(f"{impl:>14} {f'then generate {2 * L} tokens (2 canvases)':<36} {'':>8} {'':>10} {'':>6}  "
              f"graphs compiled: {later_graphs}")


if __name__ == "__main__":
    main()
