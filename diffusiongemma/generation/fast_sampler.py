"""The fast sampler: draws from the same distributions as the reference with far less work.

One uniform per position against the CDF instead of V exponentials; every quantity (argmax, entropy, sample,
self-conditioning probabilities) from one exp pass over a cache-sized block of rows; one `torch.Generator` per batch
row, so a row's draws never depend on the rest of the batch. Which rows draw is named by a host-side list, so a step
never reads device values to pick generators.

Legend: B batch, L canvas length, V vocab, N = B*L flattened positions, R rows in a block, b tokens in a vocab block,
G rows staged per soft-embedding matmul, H hidden.
"""

from typing import NamedTuple

import torch

from .entropy_bound import (
    SoftEmbed,
    StepOutput,
    block_maxima,
    entropy_bound_accept,
    first_argmax,
    renoise,
    row_block,
    vocab_block,
)


def soft_group_rows(vocab_size: int, target_bytes: int = 64 << 20) -> int:
    """Rows of fp32 probabilities per self-conditioning matmul in fast mode (about `target_bytes`, at least 64)."""
    return max(64, target_bytes // (4 * vocab_size))


def last_positive(cumsum: torch.Tensor) -> torch.Tensor:
    """[R, n] non-decreasing running sums -> [R, 1]: the first index where the sum reaches its total, i.e. the last
    entry whose weight counted (cumsum[i] > cumsum[i - 1], or i = 0 with a positive total)."""
    return torch.searchsorted(cumsum, cumsum[:, -1:].contiguous(), right=False)


def inverse_cdf_sample(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row from Categorical(weights / weights.sum()) with one uniform each (inverse CDF).

    weights [R, V] >= 0 (unnormalized, e.g. exp(z - max)), each row with a positive entry; uniforms [R] in [0, 1)
    -> tokens [R]. Two levels keep the CDF accurate: block sums (fp32 sums of ~1024 values, accumulated in fp64) pick
    the block, an fp64 cumsum inside it picks the token; each search takes the first CDF entry strictly above the
    target, so a zero-weight token is never chosen.

    The two levels round differently (an fp32 block sum can exceed the fp64 sum of the same entries), so a target can
    lie past the end of the chosen block's running sum, or u * total can round up to the total. Both searches are
    therefore capped at the last entry with weight (`last_positive`): a draw in that rounding gap lands on the last
    allowed token, never on a banned one. A row without a distribution (NaN weights) gets some in-range index; the
    caller detects it from the entropy (NaN) and raises.

    Example: weights [1, 0, 3] (p = 1/4, 0, 3/4), u = 0.5 -> target 2.0, CDF [1, 1, 4] -> token 2.
    Gap example: weights [1, 6e-8, 0, ...]: the fp32 sum is 1 + 2^-23 > 1 + 6e-8, so u = 0.99999999 targets past the
    block's fp64 running sum; uncapped the search would fall off the end onto a zero-weight token.
    """
    R, V = weights.shape
    b = vocab_block(V)
    blocks = weights.view(R, V // b, b)
    cdf = blocks.sum(dim=-1).to(torch.float64).cumsum(dim=-1)  # [R, V/b]
    target = uniforms.to(torch.float64) * cdf[:, -1]  # [R]
    block = torch.minimum(torch.searchsorted(cdf, target[:, None], right=True), last_positive(cdf))  # [R, 1]
    block = block.clamp_(max=V // b - 1)  # only NaN weights (a row with no distribution) reach past the end
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    inner = blocks[torch.arange(R, device=weights.device), block.view(-1)].to(torch.float64).cumsum(dim=-1)  # [R, b]
    token = torch.minimum(torch.searchsorted(inner, target[:, None] - before, right=True), last_positive(inner))
    token = token.clamp_(max=b - 1)
    return (block * b + token).view(-1)


class OnePass(NamedTuple):
    """Everything a denoising step needs from the tempered logits of R rows."""

    sample: torch.Tensor  # [R] long
    argmax: torch.Tensor  # [R] long
    entropy: torch.Tensor  # [R] fp32
    probs: torch.Tensor  # [R, V] fp32 softmax (self-conditioning input)


def one_pass(logits: torch.Tensor, uniforms: torch.Tensor, scratch: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> OnePass:
    """Sample, argmax, entropy and softmax of logits [R, V] from one exp pass.

    With z = x - max, e = exp(z), s = sum(e): p = e / s, log p = z - log s, so
    H = -sum(p log p) = log s - sum(e z) / s. Example: x = [0, 0] -> z = [0, 0], s = 2, sum(e z) = 0, H = ln 2.

    scratch: optional two fp32 [>= R, V] buffers for z and e, reused block after block: a fresh multi-MB tensor per
    block costs more (page faults) than the exp itself. The returned probs then live in the second one.
    """
    R = logits.shape[0]
    z_out, e_out = (scratch[0][:R], scratch[1][:R]) if scratch is not None else (None, None)
    block_max = block_maxima(logits)  # [R, V/b], one pass serves the argmax and the row max
    argmax = first_argmax(logits, block_max)
    z = torch.sub(logits, block_max.amax(dim=-1, keepdim=True), out=z_out)  # [R, V]
    e = torch.exp(z, out=e_out)
    s = e.sum(dim=-1)  # [R]
    # -inf logits (masked by a processor) must contribute 0 * finite, not 0 * -inf
    ez = z.clamp_(min=torch.finfo(z.dtype).min).mul_(e).sum(dim=-1)  # [R] sum(e * z), z's buffer reused
    entropy = s.log() - ez / s
    sample = inverse_cdf_sample(e, uniforms)
    return OnePass(sample, argmax, entropy, e.div_(s[:, None]))


def row_generators(batch: int, device: torch.device, seed=None, generator=None) -> list[torch.Generator]:
    """One generator per row for fast mode.

    Args:
        seed: int (row b gets seed + b) or a list of B ints.
        generator: a `torch.Generator` (B seeds are drawn from it) or a list of B generators (used as they are).
        Neither: B seeds are drawn from the global RNG, so `torch.manual_seed` still fixes the output.
    """
    if seed is not None and generator is not None:
        raise ValueError("Pass `seed` or `generator`, not both")
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch or not all(isinstance(g, torch.Generator) for g in generator):
            raise ValueError(f"`generator` must be one torch.Generator or a list of {batch} (one per row)")
        return list(generator)
    if isinstance(seed, (list, tuple)):
        if len(seed) != batch:
            raise ValueError(f"`seed` must be an int or a list of {batch} ints (one per row), got {len(seed)}")
        seeds = [int(s) for s in seed]
    elif seed is not None:
        seeds = [int(seed) + b for b in range(batch)]
    elif generator is not None:
        seeds = torch.randint(0, 2**32, (batch,), generator=generator, device=generator.device).tolist()
    else:
        seeds = torch.randint(0, 2**32, (batch,)).tolist()
    return [torch.Generator(device=device).manual_seed(s) for s in seeds]


class FastSampler:
    """Entropy-bound sampler drawing from per-row generators with one uniform per position (same distribution as
    the reference, different random numbers).

    Args:
        config: an `EntropyBoundSamplerConfig` (its `entropy_bound` is the acceptance budget, spec D.4f).
        context: a `SamplerContext` (vocab_size V).
    """

    per_row = True  # row b draws only from generators[b], in a fixed order: canvas init, then per step L uniforms
    # and L noise tokens

    def __init__(self, config, context):
        self.entropy_bound = config.entropy_bound
        self.vocab_size = context.vocab_size

    def init_canvas(self, batch: int, length: int, device: torch.device, generators) -> torch.Tensor:
        V = self.vocab_size
        return torch.stack([torch.randint(0, V, (length,), generator=g, device=device) for g in generators])

    def step(self, logits: torch.Tensor, canvas: torch.Tensor | None, temperature: torch.Tensor | None, step,
             generators, soft_embed: SoftEmbed | None = None) -> StepOutput:
        B, L, V = logits.shape
        device = logits.device
        # per row: L uniforms for the samples, then L noise tokens (fixed order within the row's own generator)
        uniforms = torch.stack([torch.rand(L, generator=g, device=device, dtype=torch.float64) for g in generators])
        noise = torch.stack([torch.randint(0, V, (L,), generator=g, device=device) for g in generators])
        flat, u = logits.view(B * L, V), uniforms.view(-1)
        sample = torch.empty(B * L, dtype=torch.long, device=device)
        argmax, entropy = torch.empty_like(sample), torch.empty(B * L, device=device)
        soft = None
        block = min(row_block(V), B * L)
        # the probabilities of `group` rows (several blocks) are staged for one soft-embedding matmul: a matmul over a
        # few rows against the whole [V, H] embedding is several times slower per row at large V
        # (at most half the rows, so the stage never grows into a second [B, L, V] buffer)
        group = max(block, min(soft_group_rows(V), B * L // 2) // block * block) if soft_embed is not None else block
        z_scratch, stage = logits.new_empty(block, V), logits.new_empty(group, V)  # reused block after block
        for a in range(0, B * L, block):
            g = a % group  # this block's rows in the stage
            out = one_pass(flat[a : a + block], u[a : a + block], (z_scratch, stage[g:]))  # probs land in the stage
            sample[a : a + block], argmax[a : a + block], entropy[a : a + block] = out.sample, out.argmax, out.entropy
            end = min(a + block, B * L)
            if soft_embed is not None and (end % group == 0 or end == B * L):  # the stage is full: embed it
                start = end - (g + end - a)
                piece = soft_embed(stage[: end - start])  # [G, H]
                if soft is None:
                    soft = piece.new_empty(B * L, piece.shape[-1])
                soft[start:end] = piece
        sample, argmax, entropy = sample.view(B, L), argmax.view(B, L), entropy.view(B, L)
        accepted = entropy_bound_accept(entropy, self.entropy_bound)
        return StepOutput(renoise(sample, accepted, noise), argmax, accepted, entropy,
                          soft.view(B, L, -1) if soft is not None else None)
