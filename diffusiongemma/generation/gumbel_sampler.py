"""A semantics switch (docs/reference-accuracy.md): the reference sampler with Gumbel-max instead of multinomial
sampling, the way vLLM draws (spec E). Same distribution, different random numbers: comparing an engine's trace
with and without it tells whether a divergence is only the sampling noise.

Legend: B batch, L canvas length, V vocab, N = B*L flattened positions, R rows in a block.
"""

import torch

from .entropy_bound import (
    SoftEmbed,
    StepOutput,
    blocked_rows,
    entropy_bound_accept,
    first_argmax,
    renoise,
    row_block,
    token_entropy,
)
from .reference_sampler import ReferenceSampler


def gumbel_max(logits: torch.Tensor) -> torch.Tensor:
    """One draw per row of logits [R, V] (tempered): argmax(logits + g), g = -log(-log u), u ~ U(0, 1) from the
    global RNG clamped to >= 1e-20 (spec E). Example: logits [0, -inf] -> always token 0."""
    u = torch.rand(logits.shape, device=logits.device).clamp_(min=1e-20)  # RNG: R*V uniforms
    return (logits - (-u.log()).log()).argmax(dim=-1)


class GumbelSampler(ReferenceSampler):
    """`ReferenceSampler` whose draw 1 is Gumbel-max (R*V uniforms per row block) instead of `torch.multinomial`;
    canvas init, acceptance, re-noising (draw 2) and self-conditioning are unchanged."""

    def step(self, logits: torch.Tensor, canvas=None, temperature=None, step=None, generators=None,
             soft_embed: SoftEmbed | None = None) -> StepOutput:
        B, L, V = logits.shape
        flat = logits.view(B * L, V)
        block = row_block(V)
        argmax = blocked_rows(first_argmax, flat, block).view(B, L)
        entropy = blocked_rows(token_entropy, flat, block).view(B, L)
        sample = blocked_rows(gumbel_max, flat, block).view(B, L)  # RNG draw 1, Gumbel noise (spec E)
        accepted = entropy_bound_accept(entropy, self.entropy_bound)
        noise = torch.randint(0, V, (B, L), device=logits.device)  # RNG draw 2, every position (D.4g)
        soft = soft_embed(torch.softmax(flat, dim=-1).view(B, L, V)) if soft_embed is not None else None
        return StepOutput(renoise(sample, accepted, noise), argmax, accepted, entropy, soft)
