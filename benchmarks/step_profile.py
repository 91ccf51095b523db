"""Cost of one denoising step, split into attention, MoE, the rest of the layers, LM head, sampler and
self-conditioning, for diffusiongemma (reference and fast sampling).

Times each part with wall-clock hooks around the modules of one decoder pass (so parts add up to the pass), then the
head and the sampler separately; prints medians over `--repeats` steps after a warm-up.

    python benchmarks/step_profile.py --vocab 32768 --batch 1 --threads 1
"""

import argparse
import statistics
import tempfile
import time
from collections import defaultdict

import torch

from diffusiongemma.generation.loop import soft_embedder
from diffusiongemma.generation.sampler import (EntropyBoundSamplerConfig, SamplerContext, apply_temperature_,
                                               row_generators, sampler_for, temperature_at)
from generate_vs_builtin import load_pair


class PartTimer:
    """Accumulates wall time of modules by part name through forward pre/post hooks."""

    def __init__(self):
        self.totals = defaultdict(float)
        self._start = {}

    def attach(self, module: torch.nn.Module, part: str) -> None:
        module.register_forward_pre_hook(lambda m, a: self._start.__setitem__(id(m), time.perf_counter()))
        module.register_forward_hook(
            lambda m, a, o: self.totals.__setitem__(part, self.totals[part] + time.perf_counter() - self._start[id(m)])
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        _, model = load_pair(args.vocab, args.canvas, folder)
    stack = model.model.decoder
    timer = PartTimer()
    for layer in stack.layers:
        timer.attach(layer.self_attn, "attention")
        timer.attach(layer.router, "moe")
        timer.attach(layer.experts, "moe")
        timer.attach(layer, "decoder layers (total)")
    timer.attach(stack.self_conditioning, "self-conditioning MLP")
    B, L, V = args.batch, args.canvas, args.vocab
    ids = torch.randint(3, V, (B, args.prompt))
    rows = {}
    with torch.no_grad():
        for mode in ("reference", "fast"):
            cache = model.new_cache()
            cache.reserve(args.prompt + L)
            model.encode(ids, cache)
            sampler = sampler_for(EntropyBoundSamplerConfig(entropy_bound=0.1), mode, SamplerContext(V, 16))
            gens = row_generators(B, ids.device, seed=0) if mode == "fast" else None
            canvas = sampler.init_canvas(B, L, ids.device, gens)
            soft = None
            samples = defaultdict(list)
            for step in range(args.repeats + 1):
                timer.totals.clear()
                t0 = time.perf_counter()
                hidden = model.denoise(canvas, cache, soft)
                t1 = time.perf_counter()
                logits = apply_temperature_(model.head(hidden), temperature_at(8, 16, 0.4, 0.8))
                t2 = time.perf_counter()
                out = sampler.step(logits, canvas, None, [0] * B, gens)
                t3 = time.perf_counter()
                if mode == "reference":
                    soft = stack.soft_embedding(logits)  # softmax + probs @ Emb, as the built-in does
                    t4 = time.perf_counter()
                else:  # fast mode builds the soft embedding inside its one pass: time the pass with it, subtract
                    t = time.perf_counter()
                    out = sampler.step(logits, canvas, None, [0] * B, gens, soft_embedder(stack, exact_reference=False))
                    soft = out.soft
                    t4 = t3 + (time.perf_counter() - t) - (t3 - t2)
                canvas = out.canvas
                if step == 0:
                    continue  # warm-up
                layers = timer.totals["decoder layers (total)"]
                parts = {
                    "attention": timer.totals["attention"],
                    "moe": timer.totals["moe"],
                    "other layer ops (norms, dense MLP)": layers - timer.totals["attention"] - timer.totals["moe"],
                    "embed + self-conditioning MLP + final norm": (t1 - t0) - layers,
                    "lm head + softcap + temperature": t2 - t1,
                    "sampler (entropy, sample, accept, renoise)": t3 - t2,
                    "self-conditioning soft embedding": t4 - t3,
                }
                for k, v in parts.items():
                    samples[k].append(v)
                samples["total step"].append(t4 - t0)
            rows[mode] = {k: statistics.median(v) for k, v in samples.items()}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, vocab {V}, batch {B}, canvas {L}")
    print(f"{'part':<46} {'reference ms':>13} {'fast ms':>9}")
    for k in rows["reference"]:
        print(f"{k:<46} {1000 * rows['reference'][k]:>13.1f} {1000 * rows['fast'][k]:>9.1f}")
    print("fast mode's self-conditioning row = (sampler pass with soft embedding) - (sampler pass without)")


if __name__ == "__main__":
    main()
