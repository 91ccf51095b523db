"""Wall time of `generate`: diffusiongemma vs transformers' built-in `DiffusionGemmaForBlockDiffusion`.

Both models hold the same random checkpoint (the built-in class writes it, ours loads it). For every configuration the
two implementations run alternately, `--repeats` times each after one warm-up, and the script prints the median wall
time, the ratio built-in / ours and the peak resident memory of a separate process per implementation (optional).

Reference mode must reproduce the built-in sequences exactly (asserted); fast mode draws from the same distribution
with its own generator, so only speed is compared.

    python benchmarks/generate_vs_builtin.py                          # everything (slow on 2 cores)
    python benchmarks/generate_vs_builtin.py --vocab 32768 --batch 1 --mode reference fast --repeats 3
    python benchmarks/generate_vs_builtin.py --vocab 32768 --batch 1 --mode fast fast-compiled --repeats 3
    python benchmarks/generate_vs_builtin.py --vocab 32768 --batch 4 --mode fast-compiled fast-mixed-compiled
"""

import argparse
import multiprocessing
import platform
import statistics
import sys
import tempfile
import time

import torch
import transformers
from transformers import DiffusionGemmaConfig
from transformers import DiffusionGemmaForBlockDiffusion as BuiltinModel

from diffusiongemma import DiffusionGemmaForBlockDiffusion


def small_config(vocab_size: int, canvas_length: int) -> DiffusionGemmaConfig:
    """hidden 256, 6 layers (5 sliding + 1 full), 16 experts top-4."""
    text = dict(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, global_head_dim=128, num_global_key_value_heads=1, num_experts=16,
        top_k_experts=4, moe_intermediate_size=128, sliding_window=128, max_position_embeddings=4096,
        final_logit_softcapping=30.0,
    )
    vision = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length)


def randomize_(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial norms, scales and layer scalars so every weight matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("scale"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1 + 0.2 * torch.randn(b.shape, generator=g))


def load_pair(vocab_size: int, canvas_length: int, folder: str):
    torch.manual_seed(0)
    builtin = BuiltinModel(small_config(vocab_size, canvas_length))
    randomize_(builtin)
    builtin.eval().save_pretrained(folder)
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(folder).eval()
    return builtin, ours


MODES = {  # --mode -> our generate's arguments
    "reference": {"sampling": "reference"},
    "fast": {"sampling": "fast"},
    "fast-compiled": {"sampling": "fast", "compile": True, "batching": "lockstep"},
    "fast-mixed-compiled": {"sampling": "fast", "compile": True, "batching": "mixed"},
}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def _peak_child(impl: str, folder: str, mode: str, batch: int, kw: dict, threads: int | None, queue) -> None:
    if threads:
        torch.set_num_threads(threads)
    cls = BuiltinModel if impl == "builtin" else DiffusionGemmaForBlockDiffusion
    model = cls.from_pretrained(folder).eval()
    V = model.config.text_config.vocab_size
    ids = torch.randint(3, V, (batch, kw.pop("prompt")))
    extra = {} if impl == "builtin" else MODES[mode]
    before = _status_kb("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
    torch.manual_seed(0)
    with torch.no_grad():
        model.generate(ids, **kw, **extra)
    queue.put((_status_kb("VmHWM:") - before) / 1024)


def peak_generate_mb(impl: str, folder: str, mode: str, batch: int, kw: dict, threads: int | None) -> float:
    """Peak resident memory added by one `generate` call (MB), measured in a fresh process (Linux only)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_peak_child, args=(impl, folder, mode, batch, dict(kw), threads, queue))
    proc.start()
    value = queue.get()
    proc.join()
    return value


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32768, 262144])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--mode", nargs="+", default=["reference", "fast"],
                        choices=list(MODES),
                        help="fast-compiled: fast sampling with generate(compile=True), lock-step; fast-mixed-compiled: "
                        "the same with mixed batching (the warm-up compiles; mixed compiles one graph per row "
                        "bucket)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per implementation (after one warm-up)")
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--memory", action="store_true", help="also measure peak memory of one generate per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per implementation first")
    parser.add_argument("--batching", default=None, choices=["mixed", "lockstep"],
                        help="fast mode's batching (default: generate's, mixed for batch > 1)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}, "
          f"{platform.machine()} {platform.processor() or ''}, threads {torch.get_num_threads()}")
    print(f"canvas {args.canvas}, {args.steps} denoising steps, prompt {args.prompt}, new tokens {args.new_tokens}")
    print(f"{'vocab':>7} {'batch':>5} {'mode':>19} {'builtin s':>10} {'ours s':>8} {'ratio':>6}  same"
          + ("  peak MB builtin / ours (budget 2.5*B*L*V*4 bytes; includes ~150 MB of runtime buffers)"
             if args.memory else ""))
    for V in args.vocab:
        with tempfile.TemporaryDirectory() as folder:
            builtin, ours = load_pair(V, args.canvas, folder)
            for B in args.batch:
                g = torch.Generator().manual_seed(B)
                ids = torch.randint(3, V, (B, args.prompt), generator=g)
                kw = dict(max_new_tokens=args.new_tokens, max_denoising_steps=args.steps)
                for mode in args.mode:
                    run_builtin = lambda: (torch.manual_seed(7), builtin.generate(ids, **kw))[1].sequences
                    extra = dict(MODES[mode])
                    if mode == "fast" and args.batching:
                        extra["batching"] = args.batching
                    run_ours = lambda: (torch.manual_seed(7), ours.generate(ids, **kw, **extra))[1].sequences
                    for _ in range(args.warmup):
                        run_builtin(), run_ours()
                    tb, to, same = [], [], True
                    for _ in range(args.repeats):
                        t, a = timed(run_builtin)
                        tb.append(t)
                        t, b = timed(run_ours)
                        to.append(t)
                        same &= bool(torch.equal(a, b))
                    if mode == "reference" and not same:
                        sys.exit(f"reference mode differs from the built-in sequences (vocab {V}, batch {B})")
                    mb, mo = statistics.median(tb), statistics.median(to)
                    memory = ""
                    if args.memory:
                        mkw = dict(kw, prompt=args.prompt)
                        budget = 2.5 * B * args.canvas * V * 4 / 2**20  # the target at vocab 262144, batch 4
                        ours_mb = peak_generate_mb('ours', folder, mode, B, mkw, args.threads)
                        memory = (f"  {peak_generate_mb('builtin', folder, mode, B, mkw, args.threads):.0f} / "
                                  f"{ours_mb:.0f} (budget {budget:.0f})")
                    print(f"{V:>7} {B:>5} {mode:>19} {mb:>10.3f} {mo:>8.3f} {mb / mo:>6.2f}  "
                          f"{'yes' if same else 'n/a' if mode != 'reference' else 'NO':>4}{memory}", flush=True)
            del builtin, ours


if __name__ == "__main__":
    main()
