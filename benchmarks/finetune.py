"""Fine-tuning speed and memory: training tokens/s and peak memory of full and LoRA training steps, and the speedup of
the vectorized multi-canvas loss (one encoder pass for all K canvases) over the per-canvas loop (K encoder passes).

Model: the benchmark's small model (hidden 256, 6 layers, 16 experts top-4; generate_vs_builtin.py). A step is
forward (`multi_canvas_loss`, self-conditioning on half the canvases as in training) + backward + AdamW. Tokens are
prompt + response tokens of the batch. Peak memory: CUDA max allocated on a GPU; on CPU the growth of the process's
peak RSS during the measured steps (ru_maxrss, so only the first configuration's number is clean: run one mode per
process with --modes for CPU memory). Medians of --repeat steps after --warmup.

    python benchmarks/finetune.py --threads 2
    python benchmarks/finetune.py --device cuda --batch 8 --prompt 256 --canvases 4 --canvas 256 --vocab 262144
"""

import argparse
import platform
import resource
import statistics
import sys
import time

import torch

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.training import draw_canvas_noise, multi_canvas_loss, per_canvas_loss
from generate_vs_builtin import small_config

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peak_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_mb(device, rss_before) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024  # KB on Linux


def batch(args, vocab, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab, (args.batch, args.prompt), generator=g).to(device)
    labels = torch.randint(4, vocab, (args.batch, args.canvases * args.canvas), generator=g).to(device)
    return input_ids, labels


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, args, device):
    for _ in range(args.warmup):
        step()
    times = []
    rss = peak_reset(device)
    for _ in range(args.repeat):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak_mb(device, rss)


def train_step(model, optimizer, input_ids, labels, loss_fn):
    def step():
        noise = draw_canvas_noise(labels, model.canvas_length, model.config.text_config.vocab_size)
        out = loss_fn(model, input_ids, labels, noise=noise) if loss_fn is multi_canvas_loss else \
            loss_fn(model, input_ids, labels, noise)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()

    return step


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--canvas", type=int, default=64)
    p.add_argument("--canvases", type=int, default=4)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--modes", default="full,lora,loop", help="comma list of full, lora, loop")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    modes = args.modes.split(",")
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else f'{torch.get_num_threads()} CPU threads'}")
    print(f"model: hidden 256, 6 layers, 16 experts top-4, vocab {args.vocab}; batch {args.batch}, prompt "
          f"{args.prompt}, {args.canvases} canvases x {args.canvas}")
    tokens = args.batch * (args.prompt + args.canvases * args.canvas)
    rows = []
    for mode in modes:
        torch.manual_seed(0)
        model = DiffusionGemmaForBlockDiffusion(small_config(args.vocab, args.canvas)).to(device).train()
        if mode == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank,
                                                     target_modules=TARGETS))
        params = [q for q in model.parameters() if q.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        input_ids, labels = batch(args, args.vocab, device)
        loss_fn = per_canvas_loss if mode == "loop" else multi_canvas_loss
        seconds, mb = time_steps(train_step(model, optimizer, input_ids, labels, loss_fn), args, device)
        rows.append((mode, seconds, tokens / seconds, mb, sum(q.numel() for q in params)))
        del model, optimizer
    print("\n| mode | s / step | tokens / s | peak MB | trained parameters |\n|---|---:|---:|---:|---:|")
    names = {"full": "full, vectorized", "lora": f"LoRA r{args.lora_rank}, vectorized", "loop": "full, per-canvas loop"}
    for mode, seconds, tps, mb, n in rows:
        print(f"| {names[mode]} | {seconds:.3f} | {tps:,.0f} | {mb:,.0f} | {n:,} |")
    by = {r[0]: r[1] for r in rows}
    if "full" in by and "loop" in by:
        print(f"\nvectorized / loop speedup (full fine-tuning, {args.canvases} canvases): {by['loop'] / by['full']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
