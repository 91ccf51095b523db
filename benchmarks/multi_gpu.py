"""Generated tokens per second of one rank group at the 26B-A4B text shapes (spec A.4), random bf16 weights.

Run by benchmarks/multi_gpu.sh under `torchrun --nproc-per-node N` (N = 1 runs unsharded). The model is built on the
meta device and sharded by transformers' own engine (`prepare_distribute_model` + `maybe_distribute_model`, what
`from_pretrained(distributed_config=...)` calls), then each rank fills only its own shards with random values: no
52 GB checkpoint is written or read. Every canvas runs exactly `--steps` steps (the stopper is disabled by an
unreachable confidence threshold), so the numbers do not depend on the random weights.

    torchrun --nproc-per-node 2 benchmarks/multi_gpu.py --plan tp --json out.json
    torchrun --nproc-per-node 2 benchmarks/multi_gpu.py --plan ep --tiny     # CPU (gloo) dry run at toy shapes

Plans: "none" (one process, no sharding), "tp" (DistributedConfig(tp_plan="auto")), "ep" (DistributedConfig(
ep_size=N, tp_plan={}): experts split, attention whole), "tp_ep" (DistributedConfig(tp_size=N, ep_size=N)).
"""

import argparse
import json
import os
import statistics
import time

import torch
from transformers import DiffusionGemmaConfig, DistributedConfig

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.modeling.parallel import is_dtensor, stack_plans
from diffusiongemma.modeling.parallel_request import check_divisible, expert_parallel_only, shards_attention
from gpu_26b_shapes import REAL_TEXT, SMALL_VISION, TINY_TEXT

PLANS = {
    "none": lambda n: None,
    "tp": lambda n: DistributedConfig(tp_plan="auto"),
    "ep": lambda n: DistributedConfig(ep_size=n, tp_plan={}),
    "tp_ep": lambda n: DistributedConfig(tp_size=n, ep_size=n),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_like(p: torch.Tensor, name: str, device, dtype) -> torch.Tensor:
    """Random local values for parameter `p` (its local shard when `p` is a DTensor): norms and scales near 1, the
    rest N(0, 0.02). Every rank draws from the same seed, so replicated parameters agree across ranks."""
    shape = p.to_local().shape if is_dtensor(p) else p.shape
    if "norm" in name or name.endswith("scale"):
        return torch.ones(shape, device=device, dtype=dtype)
    return (torch.randn(shape, device=device, dtype=torch.float32) * 0.02).to(dtype)


@torch.no_grad()
def materialize_(model: torch.nn.Module, device, dtype) -> None:
    """Replace every meta parameter and buffer by random values on `device`, keeping DTensor layouts."""
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    for module_name, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            local = random_like(p, f"{module_name}.{name}", device, dtype)
            if is_dtensor(p):
                local = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                           stride=p.stride())
            module._parameters[name] = torch.nn.Parameter(local, requires_grad=False)
        for name, b in list(module.named_buffers(recurse=False)):
            if b is not None and b.is_meta:
                module._buffers[name] = torch.ones(b.shape, device=device, dtype=b.dtype)
    model.tie_weights()


def build(plan: str, tiny: bool, attn: str):
    """(model on this rank's device, device, dtype, the DistributedConfig or None)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    text = dict(TINY_TEXT, num_global_key_value_heads=2) if tiny else REAL_TEXT  # tiny: KV heads divide by 2
    config = DiffusionGemmaConfig(text_config=text, vision_config=SMALL_VISION, canvas_length=256)
    config._attn_implementation = attn
    request = PLANS[plan](world)
    if request is not None:  # the checks `from_pretrained(distributed_config=...)` runs
        tp_plan, _ = stack_plans(config.text_config)
        request = expert_parallel_only(request, tp_plan)
        check_divisible(config.text_config, request.tp_size, request.ep_size, shards_attention(tp_plan, request))
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config).eval()
    device = torch.device("cpu" if tiny else f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    # from_pretrained shards before it ties lm_head to the embedding (spec B.2); the constructor tied them already
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight), requires_grad=False)
    if request is not None:
        request, device, mesh = DiffusionGemmaForBlockDiffusion.prepare_distribute_model(request)
        model = DiffusionGemmaForBlockDiffusion.maybe_distribute_model(model, request, mesh)
    dtype = torch.float32 if tiny else torch.bfloat16
    materialize_(model, device, dtype)
    return model, torch.device(device), dtype, request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", default="tp", choices=sorted(PLANS))
    parser.add_argument("--tiny", action="store_true", help="toy shapes on CPU with gloo (checks the script only)")
    parser.add_argument("--steps", type=int, default=12, help="denoising steps per canvas (fixed)")
    parser.add_argument("--canvases", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--json", help="rank 0 writes its result here")
    args = parser.parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if args.plan == "none" and world > 1:
        parser.error("--plan none runs on one process")
    if not args.tiny and not torch.cuda.is_available():
        parser.error("the 26B shapes need CUDA GPUs; --tiny checks the script on CPU")
    try:
        model, device, dtype, request = build(args.plan, args.tiny, args.attn)
    except ValueError as error:  # the plan cannot shard these shapes on this many ranks: a table row says why
        result = {"gpus": world, "plan": args.plan, "skipped": str(error)}
        if rank == 0:
            print(json.dumps(result))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f)
        return
    L, V = model.canvas_length, model.config.text_config.vocab_size
    ids = torch.randint(3, V, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1)).to(device)
    kw = dict(max_new_tokens=args.canvases * L, max_denoising_steps=args.steps, confidence_threshold=1e-30,
              eos_token_id=None, sampling="fast", seed=list(range(args.batch)))
    model.generate(ids, **dict(kw, max_new_tokens=L))  # warm-up (kernels, allocator, communicators)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, sequences = [], None
    for _ in range(args.repeats):
        sync(device)
        start = time.perf_counter()
        sequences = model.generate(ids, **kw).sequences
        sync(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    new_tokens = (sequences.shape[1] - args.prompt) * args.batch
    result = {
        "gpus": world, "plan": args.plan, "tokens_per_s": new_tokens / seconds, "seconds": seconds,
        "new_tokens": new_tokens, "steps": args.steps, "batch": args.batch, "prompt": args.prompt,
        "shapes": "tiny" if args.tiny else "26B-A4B", "dtype": str(dtype).removeprefix("torch."),
        "peak_gib_per_gpu": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "distributed_config": None if request is None else {
            "tp_size": request.tp_size, "ep_size": request.ep_size, "ep_implementation": request.ep_implementation},
    }
    if rank == 0:
        print(json.dumps(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
