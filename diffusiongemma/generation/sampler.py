"""Pick the sampler of a `generate` call, and the public sampling names in one place.

    entropy_bound.py     the math both samplers share (spec D.4c-g) and the `Sampler` interface
    reference_sampler.py draws like transformers' built-in `generate` (global RNG, same calls and order)
    fast_sampler.py      same distributions, one exp pass, one generator per row
    multinomial.py       reference mode's exact `torch.multinomial` (row blocks; cpu_rng's noise on CPU)
"""

from .entropy_bound import (
    Sampler,
    SoftEmbed,
    StepOutput,
    apply_temperature_,
    block_maxima,
    blocked_rows,
    entropy_bound_accept,
    first_argmax,
    renoise,
    row_block,
    temperature_at,
    temperature_schedule,
    token_entropy,
)
from .fast_sampler import FastSampler, OnePass, inverse_cdf_sample, one_pass, row_generators, soft_group_rows
from .multinomial import (
    NOISE_CHUNK,
    blocked_multinomial,
    exact_multinomial,
    fast_multinomial,
    fast_multinomial_is_exact,
    multinomial_is_blockwise,
)
from .gumbel_sampler import GumbelSampler
from .reference_sampler import ReferenceSampler

__all__ = [
    "FastSampler", "GumbelSampler", "NOISE_CHUNK", "OnePass", "ReferenceSampler", "SAMPLERS", "Sampler", "SoftEmbed", "StepOutput",
    "apply_temperature_", "block_maxima", "blocked_multinomial", "blocked_rows", "entropy_bound_accept",
    "exact_multinomial", "fast_multinomial", "fast_multinomial_is_exact", "first_argmax", "inverse_cdf_sample",
    "make_sampler", "multinomial_is_blockwise", "one_pass", "renoise", "row_block", "row_generators",
    "soft_group_rows", "temperature_at", "temperature_schedule", "token_entropy",
]

# "gumbel": a semantics switch, reference mode with vLLM's Gumbel-max draw (docs/reference-accuracy.md)
SAMPLERS = {"reference": ReferenceSampler, "fast": FastSampler, "gumbel": GumbelSampler}


def make_sampler(name: str, entropy_bound: float, vocab_size: int, generators: list | None = None) -> Sampler:
    """Pick a sampler once, by name ("reference", "fast" or "gumbel"; fast needs one generator per row)."""
    if name not in SAMPLERS:
        raise ValueError(f"`sampling` must be one of {sorted(SAMPLERS)}, got {name!r}")
    if name == "fast":
        return FastSampler(entropy_bound, vocab_size, generators)
    return SAMPLERS[name](entropy_bound, vocab_size)
