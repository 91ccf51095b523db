"""Memory and speed of bf16 vs FP8-dynamic vs NVFP4 checkpoints of a random DiffusionGemma (not a test).

    python benchmarks/quantized_memory.py [--hidden 1024 --layers 8 --experts 32 --moe-intermediate 256]

Writes a random bf16 checkpoint, quantizes it with `diffusiongemma quantize`'s code, then, for each format in a fresh
subprocess (clean peak-RSS numbers), loads it with `from_pretrained` and generates. Prints: checkpoint size on disk,
weight bytes resident in the model, peak process RSS after load and during generate, and generated tokens/s
(median of --repeats runs after one warm-up). RSS includes the Python/torch runtime (~0.4-0.6 GB), so the weight
columns are the ones to compare with the targets (FP8 <= 0.55x bf16, NVFP4 <= 0.33x).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))


def measure(path: str, repeats: int, new_tokens: int, steps: int) -> dict:
    """Runs in the subprocess: load, count weight bytes, generate."""
    import torch

    from diffusiongemma import DiffusionGemmaForBlockDiffusion

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    start = time.perf_counter()
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    load_s = time.perf_counter() - start
    seen = {t.data_ptr(): t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())}
    after_load = peak_rss_mb()
    ids = torch.randint(3, model.config.text_config.vocab_size, (1, 16))
    times = []
    for i in range(repeats + 1):
        torch.manual_seed(0)
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, max_denoising_steps=steps)
        if i:  # the first run is the warm-up
            times.append(time.perf_counter() - t)
    return {"weights": sum(seen.values()), "rss_load": after_load, "rss_generate": peak_rss_mb(),
            "tok_s": new_tokens / statistics.median(times), "load_s": load_s}


def build(args, root: str) -> dict:
    import torch
    from transformers import DiffusionGemmaConfig

    from diffusiongemma import DiffusionGemmaForBlockDiffusion
    from diffusiongemma.quantization.quantize import quantize_checkpoint

    text = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden,
                num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                global_head_dim=256, num_global_key_value_heads=2, num_experts=args.experts, top_k_experts=4,
                moe_intermediate_size=args.moe_intermediate, sliding_window=64, final_logit_softcapping=30.0)
    vision = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=args.canvas)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(config).to(torch.bfloat16)
    paths = {"bf16": os.path.join(root, "bf16")}
    model.save_pretrained(paths["bf16"])
    del model
    for scheme, name in (("fp8-dynamic", "fp8"), ("nvfp4", "nvfp4")):
        paths[name] = os.path.join(root, name)
        t = time.perf_counter()
        quantize_checkpoint(paths["bf16"], paths[name], scheme)
        print(f"quantized {name} in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--moe-intermediate", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--canvas", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.repeats, args.new_tokens, args.steps)))
        return

    import torch
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.processor() or platform.machine()}"
          f", {os.cpu_count()} CPUs; hidden {args.hidden}, {args.layers} layers, {args.experts} experts (Im "
          f"{args.moe_intermediate}), vocab {args.vocab}; generate {args.new_tokens} tokens, {args.steps} steps/canvas")
    with tempfile.TemporaryDirectory() as root:
        paths = build(args, root)
        rows = {}
        for name, path in paths.items():
            cmd = [sys.executable, __file__, "--measure", path, "--repeats", str(args.repeats),
                   "--new-tokens", str(args.new_tokens), "--steps", str(args.steps)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            rows[name] = {"disk": folder_bytes(path), **json.loads(out)}
    base = rows["bf16"]["weights"]
    print(f"{'format':7} {'disk MB':>9} {'weights MB':>11} {'x bf16':>7} {'RSS load MB':>12} {'RSS gen MB':>11} "
          f"{'tok/s':>7}")
    for name, r in rows.items():
        print(f"{name:7} {r['disk'] / 2**20:9.1f} {r['weights'] / 2**20:11.1f} {r['weights'] / base:7.3f} "
              f"{r['rss_load']:12.0f} {r['rss_generate']:11.0f} {r['tok_s']:7.2f}")


if __name__ == "__main__":
    main()
