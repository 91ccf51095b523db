"""Sampler math (spec D.4c-g) as pure functions, and the samplers built from them.

Reference mode draws random numbers with the same torch calls, shapes and order as transformers' built-in `generate`
(global RNG): per canvas one `randint(B, L)`; per step one `multinomial` over B*L rows, then one `randint(B, L)`.

Legend: B batch, L canvas length, V vocab.
"""

from typing import Protocol

import torch


def temperature_at(steps_remaining: int, max_steps: int, t_min: float, t_max: float) -> torch.Tensor:
    """Linear schedule T = t_min + (t_max - t_min) * n / N, with n counting the steps *remaining* (spec D.4c).

    Computed like the reference: n is an int32 tensor, so the division happens in fp32. Returns a 0-d fp32 tensor.
    """
    n = torch.tensor(steps_remaining, dtype=torch.int32)
    return t_min + (t_max - t_min) * (n / max_steps)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """[B, L, V] / T."""
    return logits / temperature.to(logits.device)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of Categorical(logits) per position, [B, L, V] -> [B, L], computed as torch.distributions does."""
    log_p = logits - logits.logsumexp(dim=-1, keepdim=True)
    p = log_p.softmax(dim=-1)
    return -(log_p.clamp(min=torch.finfo(log_p.dtype).min) * p).sum(dim=-1)


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


class Sampler(Protocol):
    def init_canvas(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        """A fresh noise canvas [B, L]."""

    def step(
        self, logits: torch.Tensor, entropy: torch.Tensor, canvas: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, L, V] (temperature applied), entropy [B, L] -> (new canvas [B, L], accepted [B, L])."""


class ReferenceSampler:
    """Entropy-bound sampler drawing from the global RNG exactly like the built-in implementation.

    Args:
        entropy_bound: acceptance budget (spec D.4f).
        vocab_size: V, the range of noise tokens.
    """

    def __init__(self, entropy_bound: float, vocab_size: int):
        self.entropy_bound = entropy_bound
        self.vocab_size = vocab_size

    def init_canvas(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (batch, length), device=device)  # RNG: canvas init (D.4.3)

    def step(self, logits, entropy, canvas):
        B, L, V = logits.shape
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        sample = torch.multinomial(probs.view(B * L, V), num_samples=1).view(B, L)  # RNG draw 1 (D.4d)
        accepted = entropy_bound_accept(entropy, self.entropy_bound)
        noise = torch.randint(0, self.vocab_size, (B, L), device=logits.device)  # RNG draw 2, every position (D.4g)
        return renoise(sample, accepted, noise), accepted


SAMPLERS = {"reference": ReferenceSampler}


def make_sampler(name: str, entropy_bound: float, vocab_size: int) -> Sampler:
    """Pick a sampler once, by name."""
    if name not in SAMPLERS:
        raise ValueError(f"`sampling` must be one of {sorted(SAMPLERS)}, got {name!r}")
    return SAMPLERS[name](entropy_bound, vocab_size)
