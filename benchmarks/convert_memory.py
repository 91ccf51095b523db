"""Peak memory and throughput of `diffusiongemma convert orbax` on a synthetic Orbax checkpoint (default >= 2 GiB).

    python benchmarks/convert_memory.py [--size-gb 2] [--chunk-mb 64] [--workdir /tmp] [--verify] [--keep]

Writes a random bf16 checkpoint in the release's tree layout with orbax-checkpoint (in this process), stored in chunks
of --chunk-mb (as a multi-device save stores one chunk per shard; 0: one chunk per array, as a single-host save of
NumPy arrays does). The converter decodes zstd zarr chunks as streams of rows (conversion/chunk_stream.py), so neither
layout makes it hold a whole decoded chunk. Then it runs the command line in a child process and reports that child's peak resident memory (getrusage's ru_maxrss of the waited
child: the converting process alone), the largest single source array, the fixed cost of the imports (a child that
only imports the command line), and the throughput in MB/s of source bytes. The checkpoint was just written, so it is
read from the page cache: the MB/s is the converter's own speed, not the disk's.

Target (issue 10): peak < 0.5 GB + the largest single array.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def synthetic_config(size_bytes: int):
    """A DiffusionGemma config (MoE text stack + a small vision tower) whose bf16 source arrays add up to at least
    `size_bytes`, reached by adding text layers."""
    from diffusiongemma.conversion.rules import expand_rules
    from diffusiongemma.modeling.config import DiffusionGemmaConfig

    def build(layers: int):
        text = dict(vocab_size=65536, hidden_size=1024, intermediate_size=2048, num_hidden_layers=layers,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=128, global_head_dim=256,
                    num_global_key_value_heads=2, num_experts=64, top_k_experts=4, moe_intermediate_size=512,
                    sliding_window=512, final_logit_softcapping=30.0, max_position_embeddings=4096,
                    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6)
                    + ["sliding_attention"] * (layers % 6 - 1) + ["full_attention"] * (layers % 6 > 0))
        vision = dict(model_type="gemma4_vision", hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, head_dim=64, standardize=True)
        return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=256)

    def source_bytes(config) -> tuple[int, int]:
        sizes = {}
        for item in expand_rules(config):
            count = 1
            for n in item.source_shape:
                count *= n
            sizes[(item.node, item.leaf)] = 2 * count
        return sum(sizes.values()), max(sizes.values())

    layers = 6
    while source_bytes(build(layers))[0] < size_bytes:
        layers += 1
    config = build(layers)
    return config, *source_bytes(config)


def child_peak(command: list[str]) -> tuple[float, int, str]:
    """Run `command` in a fresh child (forked from a tiny helper, so ru_maxrss is that command's alone);
    returns (seconds, peak RSS bytes, stderr tail)."""
    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode); "
             "sys.stderr.write(r.stderr[-3000:])")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, env=env)
    seconds, kib, code = result.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}):\n{result.stderr}")
    return float(seconds), int(kib) * 1024, result.stderr


def versions() -> str:
    from importlib.metadata import version

    names = ("orbax-checkpoint", "tensorstore", "jax", "torch", "transformers", "safetensors")
    return ", ".join(f"{n} {version(n)}" for n in names) + f", Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=2.0, help="source checkpoint size in GiB (default 2)")
    parser.add_argument("--chunk-mb", type=float, default=64,
                        help="storage chunk size in MiB (default 64); 0: one chunk per array")
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary folder in /tmp)")
    parser.add_argument("--max-shard-size", default="5GB", help="converter's --max-shard-size (default 5GB)")
    parser.add_argument("--verify", action="store_true", help="also run `convert verify` and report its peak")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and the converted folder")
    args = parser.parse_args()

    from diffusiongemma.conversion.synthetic import random_orbax_tree, write_orbax_checkpoint

    work = Path(tempfile.mkdtemp(prefix="convert_memory_", dir=args.workdir))
    src, dst = work / "orbax", work / "hf"
    try:
        config, total, largest = synthetic_config(int(args.size_gb * 2**30))
        config.save_pretrained(work / "cfg")
        print(f"synthetic checkpoint: {config.text_config.num_hidden_layers} text layers, "
              f"{config.vision_config.num_hidden_layers} vision layers, {total / 2**30:.2f} GiB bf16, largest array "
              f"{largest / 2**20:.0f} MiB", flush=True)
        start = time.perf_counter()
        chunk_bytes = int(args.chunk_mb * 2**20) or None
        write_orbax_checkpoint(random_orbax_tree(config, seed=0, dtype="bfloat16"), src, chunk_bytes)
        print(f"written by orbax-checkpoint in {time.perf_counter() - start:.1f} s", flush=True)

        cli = [sys.executable, "-m", "diffusiongemma.cli"]
        _, imports, _ = child_peak([sys.executable, "-c", "import diffusiongemma.cli, diffusiongemma.conversion."
                                    "convert, tensorstore; diffusiongemma.cli.build_parser()"])
        seconds, peak, _ = child_peak(cli + ["convert", "orbax", str(src), str(dst), "--config",
                                             str(work / "cfg" / "config.json"), "--max-shard-size",
                                             args.max_shard_size, "--quiet"])
        written = sum(f.stat().st_size for f in dst.glob("*.safetensors"))
        report = {
            "source_GiB": round(total / 2**30, 3), "storage_chunk_MiB": args.chunk_mb or "whole array",
            "largest_array_MiB": round(largest / 2**20, 1),
            "peak_rss_MiB": round(peak / 2**20, 1), "imports_only_rss_MiB": round(imports / 2**20, 1),
            "peak_minus_largest_array_MiB": round((peak - largest) / 2**20, 1),
            "target_MiB": round((0.5e9 + largest) / 2**20, 1), "seconds": round(seconds, 1),
            "MB_per_s": round(total / 1e6 / seconds, 1), "output_GiB": round(written / 2**30, 3),
            "shards": len(list(dst.glob("*.safetensors"))),
        }
        if args.verify:
            v_seconds, v_peak, _ = child_peak(cli + ["convert", "verify", str(src), str(dst), "--quiet"])
            report.update(verify_peak_rss_MiB=round(v_peak / 2**20, 1), verify_seconds=round(v_seconds, 1))
        print(json.dumps(report, indent=2))
        verdict = "below" if peak < 0.5e9 + largest else "ABOVE"
        print(f"peak {peak / 2**20:.0f} MiB is {verdict} the target 0.5 GB + largest array "
              f"({report['target_MiB']:.0f} MiB)")
        print(f"versions: {versions()}")
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
