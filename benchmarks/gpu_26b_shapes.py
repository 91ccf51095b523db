"""Decoder-pass latency and throughput at the real 26B-A4B text shapes (spec A.4), random bf16 weights, batch 1.

Meant for one large GPU (the bf16 text weights are ~52 GB). Every canvas runs exactly `--steps` denoising steps (the
stopper is disabled by an unreachable confidence threshold), so the numbers do not depend on the random weights.
Prints the median decoder pass (decoder + LM head + sampler), generated tokens per second, peak memory, and the
fraction of the HBM bandwidth bound: bytes a pass must read (every text weight, all experts being active with 256
tokens x top-8 of 128, the LM head and the embedding matrix read again by self-conditioning, the KV cache, the fp32
logits written and read) over the measured time.

    python benchmarks/gpu_26b_shapes.py                    # on the GPU machine
    python benchmarks/gpu_26b_shapes.py --tiny             # CPU dry run of the same code path at toy shapes
"""

import argparse
import statistics
import time

import torch
from transformers import DiffusionGemmaConfig

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.generation.loop import soft_embedder
from diffusiongemma.generation.sampler import (EntropyBoundSamplerConfig, SamplerContext, apply_temperature_,
                                               row_generators, sampler_for, temperature_at)

REAL_TEXT = dict(  # spec A.4
    vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30, num_attention_heads=16,
    num_key_value_heads=8, num_global_key_value_heads=2, head_dim=256, global_head_dim=512,
    use_bidirectional_attention="vision", num_experts=128, moe_intermediate_size=704, top_k_experts=8,
    sliding_window=1024, final_logit_softcapping=30.0, max_position_embeddings=262144,
)
TINY_TEXT = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, num_global_key_value_heads=1, head_dim=16, global_head_dim=32, num_experts=8,
    moe_intermediate_size=32, top_k_experts=2, sliding_window=64, final_logit_softcapping=30.0,
    max_position_embeddings=4096,
)
SMALL_VISION = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2, head_dim=16)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pass_bytes(model, batch: int, canvas: int, cached: int) -> int:
    """Bytes one decoder pass must move at least: text weights, LM head, embedding (self-conditioning), KV, logits."""
    stack = model.model.decoder
    weights = sum(p.numel() * p.element_size() for p in stack.layers.parameters())
    weights += sum(p.numel() * p.element_size() for p in stack.self_conditioning.parameters())
    embed = stack.embed_tokens.weight
    weights += 2 * embed.numel() * embed.element_size()  # LM head (tied) + soft embedding
    kv = 0
    for shape in stack.shapes:
        seen = min(cached, shape.sliding_window - 1) if shape.is_sliding else cached
        kv += 2 * batch * shape.num_kv_heads * (seen + canvas) * shape.head_dim * embed.element_size()
    logits = 2 * batch * canvas * embed.shape[0] * 4  # fp32 written by the head, read by the sampler
    return weights + kv + logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="toy shapes on CPU (checks the script, not the GPU)")
    parser.add_argument("--steps", type=int, default=12, help="denoising steps per canvas (fixed)")
    parser.add_argument("--canvases", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--sampling", default="fast", choices=["fast", "reference"])
    parser.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth in TB/s (H200 4.8, H100 3.35)")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager", "flex_attention"])
    args = parser.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        parser.error("the 26B shapes need a CUDA GPU (~52 GB of bf16 weights); --tiny checks the script on CPU")
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    config = DiffusionGemmaConfig(text_config=TINY_TEXT if args.tiny else REAL_TEXT, vision_config=SMALL_VISION,
                                  canvas_length=256)
    config._attn_implementation = args.attn
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)  # build in bf16 directly: an fp32 26B model would not fit next to its copy
    with torch.device(device):
        model = DiffusionGemmaForBlockDiffusion(config).eval()
    torch.set_default_dtype(torch.float32)
    L, V = model.canvas_length, config.text_config.vocab_size
    ids = torch.randint(3, V, (1, args.prompt), device=device)
    kw = dict(max_new_tokens=args.canvases * L, max_denoising_steps=args.steps, confidence_threshold=1e-30,
              eos_token_id=None, sampling=args.sampling)
    if args.sampling == "fast":
        kw["seed"] = 0
    model.generate(ids, **dict(kw, max_new_tokens=L))  # warm-up (kernels, allocator)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    start = time.perf_counter()
    out = model.generate(ids, **kw)
    sync(device)
    total = time.perf_counter() - start
    new_tokens = out.sequences.shape[1] - args.prompt

    # one decoder pass, timed alone: decoder + head + sampler (+ self-conditioning), cache holding the prompt
    stack = model.model.decoder
    cache = model.new_cache()
    cache.reserve(args.prompt + L)
    with torch.no_grad():
        model.encode(ids, cache)
        sampler = sampler_for(EntropyBoundSamplerConfig(entropy_bound=0.1), args.sampling, SamplerContext(V, 12))
        gens = row_generators(1, device, seed=0) if sampler.per_row else None
        canvas, soft, times = sampler.init_canvas(1, L, device, gens), None, []
        for _ in range(args.steps + 2):
            sync(device)
            t = time.perf_counter()
            logits = apply_temperature_(model.head(model.denoise(canvas, cache, soft)), temperature_at(6, 12, 0.4, 0.8))
            step = sampler.step(logits, canvas, None, [0], gens,
                                soft_embedder(stack, exact_reference=args.sampling == "reference"))
            soft = step.soft if step.soft is not None else stack.soft_embedding(logits.to(dtype))
            canvas = step.canvas
            sync(device)
            times.append(time.perf_counter() - t)
    latency = statistics.median(times[2:])
    moved = pass_bytes(model, 1, L, args.prompt)
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, dtype {dtype}, "
          f"torch {torch.__version__}, {'tiny' if args.tiny else '26B-A4B'} shapes, sampling {args.sampling}")
    print(f"decoder pass (decoder + LM head + sampler): {1000 * latency:.2f} ms median over {len(times) - 2}")
    print(f"generate: {new_tokens} tokens in {total:.2f} s = {new_tokens / total:.1f} tokens/s "
          f"({args.canvases} canvases x {args.steps} steps, prompt {args.prompt})")
    print(f"bytes per pass >= {moved / 1e9:.2f} GB -> {moved / latency / 1e12:.2f} TB/s = "
          f"{100 * moved / latency / (args.hbm_tbps * 1e12):.1f}% of {args.hbm_tbps} TB/s")
    if device.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
