"""argparse types shared by every command (the top-level CLI and each subpackage's), at the bottom layer so that
no subpackage CLI imports the top-level `cli`."""

import argparse
import math


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


def bounded_float(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False):
    """argparse type: a finite number between `low` and `high` (open ends excluded), e.g. `bounded_float(0)` for
    >= 0 and `bounded_float(0, low_open=True)` for > 0. inf and nan are always refused."""
    if high == math.inf:
        wanted = f"{'>' if low_open else '>='} {low:g}"
    else:
        wanted = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a finite number {wanted}, got {text!r}") from None
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(f"must be a finite number {wanted}, got {text}")
        return value

    parse.__name__ = f"number {wanted}"
    return parse


def bounded_int(low: int, high: int, what: str):
    """argparse type: an integer in [low, high]; `what` says where the bound comes from (shown in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}] ({what}), got {value}")
        return value

    parse.__name__ = f"int in [{low}, {high}]"
    return parse


def steps_arg(text: str) -> int:
    """argparse type for --steps (max_denoising_steps): 1 .. MAX_DENOISING_STEPS."""
    from .generation_config import MAX_DENOISING_STEPS

    return bounded_int(1, MAX_DENOISING_STEPS, "max_denoising_steps' bound, docs/errors.md")(text)


def seed_arg(text: str) -> int:
    """argparse type for --seed: 0 .. 2**32 - 1 (the CPU generator keeps 32 bits of a seed)."""
    return bounded_int(0, 2**32 - 1, "the CPU generator keeps 32 bits of a seed")(text)


def port_arg(text: str) -> int:
    """argparse type for --port: 0 .. 65535 (0: any free port)."""
    return bounded_int(0, 65535, "a TCP port")(text)
