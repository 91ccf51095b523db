"""The random draws the commit-style samplers make (block refinement, confidence threshold, discrete DDIM), from
the global RNG or from one generator per row.

Both sources draw diffusers' scheduler calls in diffusers' order, so a sampler built on these functions reproduces
diffusers bit for bit: with the global RNG over the whole batch (diffusers' `generator=None`, or one generator for
the batch seeded like the global one), with per-row generators row by row (diffusers run on that row alone with that
row's generator).

Legend: B rows, L canvas length, V vocab (or any number of categories), k picks per row.
"""

from typing import Sequence

import torch

from .entropy_bound import row_block
from .multinomial import exact_multinomial, fast_multinomial, fast_multinomial_is_exact

Generators = Sequence[torch.Generator] | None  # one per row, or None: the global RNG


def _row_multinomial(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`torch.multinomial(probs, 1, generator=generator).view(-1)` for probs [R, V], by the exact fast path on CPU."""
    if probs.device.type == "cpu" and probs.dtype == torch.float32 and probs.is_contiguous() \
            and fast_multinomial_is_exact():
        return fast_multinomial(probs, generator)
    return torch.multinomial(probs, 1, generator=generator).view(-1)


def categorical(probs: torch.Tensor, generators: Generators) -> torch.Tensor:
    """One draw per position from probs [B, L, V] (rows summing to 1, or at least one positive entry) -> [B, L].

    Global RNG: one `torch.multinomial` over the B*L rows (diffusers' call); per row: one over row b's L rows with
    generators[b].
    """
    B, L, V = probs.shape
    if generators is None:
        flat = probs.reshape(B * L, V)
        if flat.dtype == torch.float32:
            return exact_multinomial(flat.contiguous(), row_block(V)).view(B, L)  # RNG: B*L draws
        return torch.multinomial(flat, 1).view(B, L)
    return torch.stack([_row_multinomial(probs[b].contiguous(), g) for b, g in enumerate(generators)])


def random_tokens(vocab_size: int, shape: tuple[int, int], device: torch.device, generators: Generators
                  ) -> torch.Tensor:
    """Uniform noise tokens [B, L] in [0, V): `torch.randint` over the batch, or L per row from its generator."""
    B, L = shape
    if generators is None:
        return torch.randint(0, vocab_size, (B, L), device=device)  # RNG: B*L ints
    return torch.stack([torch.randint(0, vocab_size, (L,), generator=g, device=device) for g in generators])


def uniforms(shape: tuple[int, int], device: torch.device, generators: Generators,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U[0, 1) [B, L]: `torch.rand` over the batch, or L per row from its generator."""
    B, L = shape
    if generators is None:
        return torch.rand((B, L), device=device, dtype=dtype)  # RNG: B*L uniforms
    return torch.stack([torch.rand(L, generator=g, device=device, dtype=dtype) for g in generators])

