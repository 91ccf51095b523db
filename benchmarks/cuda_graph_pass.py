"""The compiled denoising pass (`DenoisePass`, mode="reduce-overhead": a CUDA graph) against the eager exact pass.

Builds a small random model on CUDA, encodes a prompt into a static cache, then times one denoising pass (decoder over
the canvas + LM head) eagerly and replayed as a CUDA graph; prints medians over `--repeats`, the ratio, versions and
hardware. Without CUDA it exits with a message (status 0 with --allow-cpu, else 2).

    python benchmarks/cuda_graph_pass.py --batch 4 --prompt 128 --dtype bf16
"""

import argparse
import statistics
import sys
import time

import torch

from diffusiongemma.modeling.compile import DenoisePass
from diffusiongemma.modeling.config import DiffusionGemmaConfig
from diffusiongemma import DiffusionGemmaForBlockDiffusion


def small_model(canvas_length: int, dtype: torch.dtype) -> DiffusionGemmaForBlockDiffusion:
    text = dict(vocab_size=32768, hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                num_key_value_heads=4, head_dim=64, global_head_dim=128, num_global_key_value_heads=2, num_experts=8,
                top_k_experts=2, moe_intermediate_size=256, sliding_window=128, max_position_embeddings=4096,
                final_logit_softcapping=30.0)
    config = DiffusionGemmaConfig(text_config=text, vision_config=None, canvas_length=canvas_length)
    torch.manual_seed(0)
    return DiffusionGemmaForBlockDiffusion(config).to("cuda", dtype).eval()


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--canvas", type=int, default=32)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--allow-cpu", action="store_true", help="exit 0 (not 2) when there is no CUDA device")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cuda_graph_pass.py: no CUDA device; the reduce-overhead (CUDA graph) pass needs one, nothing timed")
        sys.exit(0 if args.allow_cpu else 2)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = small_model(args.canvas, dtype)
    B, L = args.batch, args.canvas
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(3, 32768, (B, args.prompt), device="cuda", generator=g)
    canvas = torch.randint(0, 32768, (B, L), device="cuda", generator=g)
    cache = model.new_cache()
    cache.reserve(args.prompt + 2 * L)
    graph_pass = DenoisePass(model, mode="reduce-overhead")
    with torch.no_grad():
        model.encode(ids, cache)
        soft = model.get_decoder().soft_embedding(model.head(model.denoise(canvas, cache)))  # [B, L, H]
        eager = lambda: model.head(model.denoise(canvas, cache, soft))  # noqa: E731
        graphed = lambda: graph_pass(canvas, cache, soft)  # noqa: E731
        for _ in range(3):  # compile, record the graph, warm up
            eager(), graphed()
        diff = (graphed().float() - eager().float()).abs().max().item()
        eager_ms, graph_ms = median_ms(eager, args.repeats), median_ms(graphed, args.repeats)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.dtype}, B={B} P={args.prompt} L={L}")
    print(f"cuda graph pass: eager {eager_ms:.3f} ms, reduce-overhead {graph_ms:.3f} ms, "
          f"ratio {eager_ms / graph_ms:.2f}x (median of {args.repeats}; max |logit diff| {diff:.3g})")


if __name__ == "__main__":
    main()
