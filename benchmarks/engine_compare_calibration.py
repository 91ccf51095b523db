"""Calibration of `compare --engine-url` (accuracy/engine_compare.py): how often an agreeing engine fails.

Serves a model on loopback with our own `serve` (in-process), then runs the comparison against the very same
checkpoint `--runs` times, each with its own seeds (run i asks seeds 1000 i + s). The engine computes what the
reference computes, so every failure is a false alarm. Prints the t statistics and p-values (p should be
roughly uniform if the test is calibrated), the false alarm count, how many runs were inconclusive (their minimum
detectable difference above the default --max-detectable) and the time per run.

    python benchmarks/engine_compare_calibration.py --runs 20                      # random tiny model (flat)
    python benchmarks/engine_compare_calibration.py --runs 10 --model sudoku       # the bundled Sudoku model

Builds the tiny model itself (no download); a random tiny model has flat, high-variance answers, which is where
a z-test can misfire.
"""

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from diffusiongemma import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from diffusiongemma.accuracy.engine_compare import compare_engine
from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app


def tiny_checkpoint(path: Path) -> str:
    """A random tiny model (6 layers, V = 128, L = 16) with sharpened logits and a character tokenizer whose filler
    tokens are added tokens (text round-trips to ids)."""
    text = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, num_experts=4,
                top_k_experts=2, moe_intermediate_size=32, sliding_window=8, max_position_embeddings=1024,
                final_logit_softcapping=30.0)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=text, canvas_length=16)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.generation_config.update(eos_token_id=1, pad_token_id=0, max_new_tokens=16, max_denoising_steps=6,
                                   stability_threshold=0, confidence_threshold=0.8)
    model.save_pretrained(path)
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>"] + [chr(c) for c in range(32, 127)])}
    vocab.update({f"<x{i}>": i for i in range(len(vocab), 128)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Split("", behavior="isolated"), decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", padding_side="left")
    fast.add_tokens([f"<x{i}>" for i in range(99, 128)])
    fast.save_pretrained(path)
    return str(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "sudoku"], default="tiny")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "tiny":
            path = tiny_checkpoint(Path(tmp) / "tiny")
            prompts, max_tokens = ["Hello there", "The quick brown fox", "A third prompt"], 16
        else:
            import random

            from diffusiongemma.sudoku.demo import DEMO_MODEL
            from diffusiongemma.sudoku.puzzles import make_puzzle

            path, rng = str(DEMO_MODEL), random.Random(0)
            prompts, max_tokens = [f"<bos>{make_puzzle(rng, 34)[0].replace('0', '.')}|" for _ in range(3)], 82
        served = build_app(ServeOptions(model=path, max_model_len=256))
        server = BackgroundServer(served.app).start()
        reference = DiffusionGemmaForBlockDiffusion.from_pretrained(path).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        rows = []
        try:
            for i in range(args.runs):
                start = time.perf_counter()
                s = compare_engine(reference, tokenizer, server.url + "/v1", prompts, args.samples, max_tokens,
                                   False, None, seed=1000 * i)
                d = s["logprob_difference"]
                rows.append({"run": i, "t": d["t"], "df": d["df"], "p": d["p_value"],
                             "p_beyond_margin": d["p_beyond_margin"], "difference": d["difference"],
                             "detectable": d["detectable"], "verdict": s["verdict"],
                             "seconds": time.perf_counter() - start})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            server.stop()
            served.state.shutdown()
    zs = [r["t"] for r in rows if r["t"] is not None and math.isfinite(r["t"])]
    alarms = sum(r["verdict"] == "fail" for r in rows)
    inconclusive = sum(r["verdict"] == "inconclusive" for r in rows)
    print(f"model {args.model}: {len(rows)} agreeing runs of {len(prompts)} prompts x {args.samples} samples: "
          f"{alarms} false alarm(s), {inconclusive} inconclusive (too little power), "
          f"{len(rows) - alarms - inconclusive} pass(es); minimum detectable difference median "
          f"{statistics.median(r['detectable'] for r in rows):.4f}, max {max(r['detectable'] for r in rows):.4f} "
          f"nats; min p {min(r['p'] for r in rows):.2g}, min p beyond the margin "
          f"{min(r['p_beyond_margin'] for r in rows):.2g}, smallest d {min(r['difference'] for r in rows):+.4f}; "
          f"t mean {statistics.fmean(zs):+.3f}, sd "
          f"{statistics.stdev(zs) if len(zs) > 1 else float('nan'):.3f}, min {min(zs):+.3f}; "
          f"{statistics.median(r['seconds'] for r in rows):.1f} s per run (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
