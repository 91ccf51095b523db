"""argparse types shared by every command (the top-level CLI and each subpackage's), at the bottom layer so that
no subpackage CLI imports the top-level `cli`."""

import argparse


def dtype_arg(name: str):
    """argparse type for --dtype: float32/fp32, bfloat16/bf16, float16/fp16 or auto."""
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16, "auto": "auto"}
    if name not in table:
        raise argparse.ArgumentTypeError(f"--dtype must be one of {sorted(table)}, got {name!r}")
    return table[name]


def positive_int(text: str) -> int:
    """argparse type: an integer > 0 (shared by every command)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
