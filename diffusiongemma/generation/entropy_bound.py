"""The entropy-bound sampler's math (spec D.4c-g) as pure functions, shared by the reference and the fast sampler,
and `StepOutput`, what every sampler returns (the protocol itself is in `sampler.py`).

Both samplers walk the [B*L, V] logits in blocks of rows (`row_block`): every per-row op gives the same bits on a block
as on the whole tensor, so temporaries stay a few MB instead of extra [B, L, V] buffers.

Legend: B batch, L canvas length, V vocab, N = B*L flattened positions, R rows in a block, H hidden.
"""

import math
from typing import Callable, NamedTuple, Sequence

import torch


def temperature_at(steps_remaining: int, max_steps: int, t_min: float, t_max: float) -> torch.Tensor:
    """Linear schedule T = t_min + (t_max - t_min) * n / N, with n counting the steps *remaining* (spec D.4c).

    Computed like the reference: n is an int32 tensor, so the division happens in fp32. Returns a 0-d fp32 tensor.
    """
    n = torch.tensor(steps_remaining, dtype=torch.int32)
    return t_min + (t_max - t_min) * (n / max_steps)


def temperature_schedule(max_steps: int, t_min: float, t_max: float, device: torch.device) -> torch.Tensor:
    """[N + 1] fp32 on `device`: entry n is `temperature_at(n, ...)` (entry 0 unused). Copied to the device once per
    `generate` call, so a step indexes it instead of copying a scalar host to device (a sync on CUDA)."""
    return torch.stack([temperature_at(n, max_steps, t_min, t_max) for n in range(max_steps + 1)]).to(device)


def apply_temperature_(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """In place [B, L, V] / T: the reference's `scores / temperature`, without a new buffer."""
    return logits.div_(temperature.to(logits.device))


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of Categorical(logits) per position, [..., V] -> [...], computed as torch.distributions does.

    Example: logits [0, 0] -> p = (1/2, 1/2) -> H = ln 2 = 0.6931; logits [0, -inf] -> H = 0 (the clamp turns
    0 * -inf into 0 * finfo.min = 0).
    """
    log_p = logits - logits.logsumexp(dim=-1, keepdim=True)
    p = log_p.softmax(dim=-1)
    return -(log_p.clamp_(min=torch.finfo(log_p.dtype).min).mul_(p)).sum(dim=-1)


def entropy_bound_accept(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """Accept the lowest-entropy positions while the sum of the strictly lower-ranked entropies is <= bound.

    entropy [B, L] -> accepted [B, L] bool. The lowest-entropy position is always accepted; the accepted set is a
    prefix of the ascending ranking (spec D.4f). Example: entropies [0.3, 0.01, 0.05], bound 0.1 -> ranks
    (0.01, 0.05, 0.3), exclusive cumsums (0, 0.01, 0.06) all <= 0.1 -> all three accepted.
    """
    ranked, order = torch.sort(entropy, dim=-1)
    keep = torch.cumsum(ranked, dim=-1) - ranked <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


def renoise(sample: torch.Tensor, accepted: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Accepted positions take the sample, all others fresh noise (the previous canvas is never kept, D.4g)."""
    return torch.where(accepted, sample, noise)


def row_block(vocab_size: int, target_bytes: int = 4 << 20) -> int:
    """Rows of fp32 logits per block so that one block is about `target_bytes` (stays in cache)."""
    return max(1, target_bytes // (4 * vocab_size))


def blocked_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows_per_block: int) -> torch.Tensor:
    """Apply a per-row function to [N, V] one block of rows at a time and concatenate (bit-identical to fn(x))."""
    return torch.cat([fn(x[a : a + rows_per_block]) for a in range(0, x.shape[0], rows_per_block)])


def vocab_block(vocab_size: int) -> int:
    """Tokens per block for two-level searches: a divisor of V near 1024 (V itself when V has none)."""
    b = math.gcd(vocab_size, 1024)
    return b if b >= 32 else vocab_size


def block_maxima(x: torch.Tensor) -> torch.Tensor:
    """Maxima of x [R, V] over `first_argmax`'s blocks -> [R, V/b]; their max is the row max."""
    R, V = x.shape
    return x.view(R, V // vocab_block(V), -1).amax(dim=-1)


def first_argmax(x: torch.Tensor, block_max: torch.Tensor | None = None) -> torch.Tensor:
    """`x.argmax(-1)` for [R, V] (the first maximum), in two levels: block maxima, then one block.

    Same index as torch.argmax (ties go to the first occurrence in both levels), several times faster on CPU, where
    argmax is not vectorized but amax is. block_max: `block_maxima(x)` when the caller already has it.
    """
    R, V = x.shape
    b = vocab_block(V)
    blocks = x.view(R, V // b, b)
    if block_max is None:
        block_max = blocks.amax(dim=-1)  # [R, V/b]
    block = block_max.argmax(dim=-1)  # [R]
    inside = blocks[torch.arange(R, device=x.device), block].argmax(dim=-1)  # [R]
    return block * b + inside


class StepOutput(NamedTuple):
    """What a sampler's step returns for the B' rows it was given (what the next step and a trace need).

    `soft` is the self-conditioning input built with the `soft_embed` the sampler was given, or None: the engine then
    builds it from the tempered logits (a sampler given a `soft_embed` that returns None must leave them untouched).
    `state` is what a sampler with `init_state` needs at its next step (batch first), handed back as `state=`.
    """

    canvas: torch.Tensor  # [B', L] accepted samples + fresh noise: the next decoder input
    argmax: torch.Tensor  # [B', L] long, committed when the canvas ends
    accepted: torch.Tensor  # [B', L] bool, positions that kept their sample
    entropy: torch.Tensor  # [B', L] fp32 (stopping, traces)
    soft: torch.Tensor | None = None  # [B', L, H]
    state: torch.Tensor | None = None  # [B', ...] the sampler's per-row state after this step (stateful samplers)
    drawn: torch.Tensor | None = None  # [B', L] long, the token drawn at every position (samplers that draft all)


SoftEmbed = Callable[[torch.Tensor], torch.Tensor]  # probs [..., V] fp32 -> soft embedding [..., H]
RowIds = Sequence[int] | torch.Tensor  # host-side batch row indices (a list, or a CPU tensor)
