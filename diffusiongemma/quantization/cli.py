"""`diffusiongemma quantize --scheme fp8-dynamic|nvfp4 SRC DST`: write a compressed-tensors checkpoint."""

import argparse
import math
import sys


def add_quantize_command(subparsers) -> None:
    from diffusiongemma.quantization.quantize import DEFAULT_CALIBRATION_PROMPTS, SCHEMES

    p = subparsers.add_parser(
        "quantize",
        help="write an FP8-dynamic or NVFP4 compressed-tensors checkpoint from a bf16 checkpoint folder",
        description=(
            "Quantize every Linear (attention, dense MLP and every routed expert, split into per-expert "
            "experts.{e}.gate_proj/up_proj/down_proj) to the compressed-tensors format vLLM and this package load. "
            "lm_head, embeddings, routers, the vision tower and projector and self-conditioning stay in the source "
            "dtype. NVFP4 calibrates activation scales on a few prompts: --calibration-file (one prompt per line), "
            f"default {len(DEFAULT_CALIBRATION_PROMPTS)} short built-in prompts, tokenized with SRC's tokenizer "
            "(random token ids if SRC has none). The dense model is loaded into CPU memory once."
        ),
    )
    p.add_argument("src", help="dense checkpoint folder (config.json + safetensors)")
    p.add_argument("dst", help="output folder")
    p.add_argument("--scheme", required=True, choices=SCHEMES, help="fp8-dynamic (FP8_DYNAMIC) or nvfp4 (NVFP4)")
    p.add_argument("--calibration-file", default=None, help="NVFP4 only: text file, one calibration prompt per line")
    p.add_argument("--max-shard-size", type=shard_size, default=5.0,
                   help="safetensors shard size in GiB, > 0 (default 5)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace DST if it already holds a checkpoint (it is swapped in only once complete)")
    p.set_defaults(func=run_quantize)


def shard_size(text: str) -> float:
    """--max-shard-size: a finite number of GiB > 0 (0 would write one shard per tensor)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of GiB, got {text!r}") from None
    if not math.isfinite(value) or value <= 0 or int(value * 2**30) < 1:
        raise argparse.ArgumentTypeError(f"must be a finite number of GiB > 0, got {text!r}")
    return value


def run_quantize(args) -> int:
    from diffusiongemma.quantization.quantize import quantize_checkpoint

    prompts = None
    if args.calibration_file:
        if args.scheme != "nvfp4":
            print("note: --calibration-file is only used by --scheme nvfp4 (FP8 activations are dynamic)",
                  file=sys.stderr)
        with open(args.calibration_file) as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
        if not prompts:
            print(f"error: {args.calibration_file} has no prompts (one per line expected)", file=sys.stderr)
            return 2
    info = quantize_checkpoint(args.src, args.dst, args.scheme, prompts, int(args.max_shard_size * 2**30),
                               overwrite=args.overwrite)
    calibration = f", activation scales calibrated on {info['calibration']}" if info["calibration"] else ""
    print(f"wrote {args.dst}: {info['quantized_linears']} quantized Linears, {info['bytes'] / 2**20:.1f} MiB of "
          f"tensors ({args.scheme}){calibration}", file=sys.stderr)
    return 0
