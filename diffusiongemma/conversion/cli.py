"""`diffusiongemma convert orbax SRC DST` and `diffusiongemma convert verify SRC DST` (docs/conversion.md)."""

import sys

from .safetensors_stream import parse_size

DTYPES = ("bfloat16", "float16", "float32")


def _shard_size(text: str):
    import argparse

    try:
        parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_convert_commands(subparsers) -> None:
    convert = subparsers.add_parser(
        "convert", help="convert the original Orbax (JAX) checkpoint to the Hugging Face layout, and verify it",
        description="Convert an Orbax DiffusionGemma checkpoint (`convert orbax`) and check a conversion "
                    "(`convert verify`). Needs: pip install \"diffusiongemma[convert]\".",
    )
    commands = convert.add_subparsers(dest="convert_command", metavar="{orbax,verify}", required=True)
    p = commands.add_parser(
        "orbax", help="stream an Orbax checkpoint into a Hugging Face folder",
        description="Read the Orbax PyTree checkpoint SRC (rooted at params/transformer/) one array at a time and "
                    "write DST: config.json, generation_config.json (the released defaults) and sharded safetensors "
                    "with an index, loadable by diffusiongemma and by transformers' built-in class. Every array's "
                    "shape is checked against the config first. DST is written to a temporary sibling and renamed "
                    "when complete.",
    )
    p.add_argument("src", help="Orbax checkpoint folder (holds _METADATA)")
    p.add_argument("dst", help="output folder")
    p.add_argument("--config", default=None,
                   help="DiffusionGemmaConfig JSON (or a folder with config.json); default: the released 26B-A4B")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="output dtype (default bfloat16)")
    p.add_argument("--text-only", action="store_true",
                   help="leave out the vision tower and projector (config.json gets vision_config: null)")
    p.add_argument("--max-shard-size", type=_shard_size, default="5GB",
                   help="largest safetensors shard, e.g. 5GB (default), 500MB, 2GiB")
    p.add_argument("--tokenizer", default=None, help="tokenizer/processor folder to copy into DST")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it already holds a checkpoint")
    p.add_argument("--allow-unused", action="store_true",
                   help="skip Orbax arrays that no rule converts instead of failing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_convert)
    v = commands.add_parser(
        "verify", help="check a converted folder against its Orbax checkpoint, tensor by tensor",
        description="Re-read SRC and DST and list every mismatch: missing or extra tensors, dtype and shape against "
                    "DST's config, and each tensor's values against its source array (exact after the cast). Exit "
                    "status 1 when anything differs.",
    )
    v.add_argument("src", help="Orbax checkpoint folder")
    v.add_argument("dst", help="converted folder")
    v.add_argument("--allow-unused", action="store_true", help="do not report Orbax arrays that no rule converts")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=run_verify)


def run_convert(args) -> int:
    from .convert import convert_orbax
    from .plan import ConversionError

    try:
        info = convert_orbax(args.src, args.dst, config=args.config, dtype=args.dtype, text_only=args.text_only,
                             max_shard_size=args.max_shard_size, tokenizer=args.tokenizer, overwrite=args.overwrite,
                             allow_unused=args.allow_unused, progress=not args.quiet)
    except ConversionError as error:
        print(f"error: {error}", file=sys.stderr)  # every problem on its own line
        return 1
    print(f"wrote {args.dst}: {info['tensors']} tensors, {info['bytes'] / 2**20:.1f} MiB in {info['shards']} "
          f"shard(s), {info['seconds']:.1f} s", file=sys.stderr)
    return 0


def run_verify(args) -> int:
    from .verify import verify_conversion

    problems = verify_conversion(args.src, args.dst, allow_unused=args.allow_unused, progress=not args.quiet)
    if problems:
        print(f"{args.dst} does not match {args.src} ({len(problems)} problem(s)):", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(f"{args.dst} matches {args.src}: every tensor exact", file=sys.stderr)
    return 0
