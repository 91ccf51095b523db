"""The reference sampler: draws random numbers with the same torch calls, shapes and order as transformers' built-in
`generate` (global RNG): per canvas one `randint(B, L)`; per step one `multinomial` over B*L rows, then one
`randint(B, L)` (spec D.4).

Legend: B batch, L canvas length, V vocab, N = B*L flattened positions, H hidden.
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
from .multinomial import exact_multinomial


class ReferenceSampler:
    """Entropy-bound sampler drawing from the global RNG exactly like the built-in implementation.

    Args:
        config: an `EntropyBoundSamplerConfig` (its `entropy_bound` is the acceptance budget, spec D.4f).
        context: a `SamplerContext` (vocab_size: the range of noise tokens).
    """

    per_row = False  # the global RNG, in the built-in's order

    def __init__(self, config, context):
        self.entropy_bound = config.entropy_bound
        self.vocab_size = context.vocab_size

    def init_canvas(self, batch: int, length: int, device: torch.device, generators=None) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (batch, length), device=device)  # RNG: canvas init (D.4.3)

    def step(self, logits: torch.Tensor, canvas=None, temperature=None, step=None, generators=None,
             soft_embed: SoftEmbed | None = None) -> StepOutput:
        B, L, V = logits.shape
        flat = logits.view(B * L, V)
        block = row_block(V)
        argmax = blocked_rows(first_argmax, flat, block).view(B, L)  # [B, L], same indices as logits.argmax(-1)
        entropy = blocked_rows(token_entropy, flat, block).view(B, L)
        probs = torch.softmax(flat, dim=-1, out=flat)  # [N, V] in place (same bits): the logits are not needed again
        sample = exact_multinomial(probs, block).view(B, L)  # RNG draw 1 (D.4d)
        accepted = entropy_bound_accept(entropy, self.entropy_bound)
        noise = torch.randint(0, V, (B, L), device=logits.device)  # RNG draw 2, every position (D.4g)
        # with fp32 embeddings the built-in's self-conditioning softmax equals these probs bit for bit
        soft = soft_embed(probs.view(B, L, V)) if soft_embed is not None else None
        return StepOutput(renoise(sample, accepted, noise), argmax, accepted, entropy, soft)
