"""The `Sampler` protocol and the registry that picks a sampler from the generation config's `sampler_config`.

    entropy_bound.py     the math the entropy-bound samplers share (spec D.4c-g) and `StepOutput`
    reference_sampler.py draws like transformers' built-in `generate` (global RNG, same calls and order)
    fast_sampler.py      same distributions, one exp pass, one generator per row
    block_refinement.py, confidence_threshold.py, discrete_ddim.py
                         the commit-style samplers (diffusers' schedulers, mlx-vlm, Fast-dLLM); commit.py and
                         draws.py hold what they share
    gumbel_sampler.py    reference mode with vLLM's Gumbel-max draw (a semantics switch)
    multinomial.py       reference mode's exact `torch.multinomial` (row blocks; cpu_rng's noise on CPU)

A sampler is registered once under its config class and a sampling name (`register_sampler`); `generate` picks it
with `sampler_for(config.sampler_config, sampling, ...)`. Where its randomness comes from is the sampler's own
attribute `per_row`: True draws only from the generators it is handed (one per row, so a row's tokens do not depend
on the rest of the batch: mixed batching and the server need it), False draws from the global RNG in the reference
order (lock-step only).

Legend: B' rows that sample, L canvas length, V vocab, H hidden.
"""

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from .entropy_bound import (
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
from .block_refinement import BlockRefinementReferenceSampler, BlockRefinementSampler, BlockRefinementSamplerConfig
from .confidence_threshold import (ConfidenceThresholdReferenceSampler, ConfidenceThresholdSampler,
                                   ConfidenceThresholdSamplerConfig)
from .discrete_ddim import DiscreteDDIMReferenceSampler, DiscreteDDIMSampler, DiscreteDDIMSamplerConfig
from .gumbel_sampler import GumbelSampler
from .multinomial import (
    NOISE_CHUNK,
    blocked_multinomial,
    exact_multinomial,
    fast_multinomial,
    fast_multinomial_is_exact,
    multinomial_is_blockwise,
)
from .reference_sampler import ReferenceSampler
from ..sampler_configs import EntropyBoundSamplerConfig, register_sampler_config

__all__ = [
    "BaseSampler", "FastSampler", "GumbelSampler", "NOISE_CHUNK", "OnePass", "ReferenceSampler", "Sampler",
    "SamplerContext", "SoftEmbed", "StepOutput", "apply_temperature_", "block_maxima", "blocked_multinomial",
    "blocked_rows", "entropy_bound_accept", "exact_multinomial", "fast_multinomial", "fast_multinomial_is_exact",
    "first_argmax", "init_sampler_state", "inverse_cdf_sample", "multinomial_is_blockwise", "one_pass",
    "register_sampler", "renoise", "row_block", "row_generators", "sampler_class_for", "sampler_for",
    "sampler_names", "sampling_names", "soft_group_rows", "temperature_at", "temperature_schedule", "token_entropy",
]


@dataclass(frozen=True)
class SamplerContext:
    """What a sampler learns once, when it is built: the model's vocabulary and the run's step budget."""

    vocab_size: int  # V: noise tokens are drawn from [0, V)
    max_steps: int  # N: denoising steps per canvas (a schedule such as an even commit quota needs it)


class Sampler(Protocol):
    """One denoising step's sampling rule. Built as `SamplerClass(sampler_config, context)`.

    Attributes:
        per_row: True: draws only from the `generators` passed in (one per row); False: from the global RNG.
    """

    per_row: bool

    def init_canvas(self, batch: int, length: int, device: torch.device,
                    generators: Sequence[torch.Generator] | None) -> torch.Tensor:
        """A fresh noise canvas [B', L] (spec D.4.3); `generators`: one per row, or None (global RNG)."""

    def step(self, logits: torch.Tensor, canvas: torch.Tensor, temperature: torch.Tensor, step: Sequence[int],
             generators: Sequence[torch.Generator] | None, soft_embed: SoftEmbed | None = None) -> StepOutput:
        """One step for B' rows.

        Args:
            logits: [B', L, V] fp32, processed and already divided by `temperature`. Without a `soft_embed` the
                sampler may overwrite them (the engine built the self-conditioning input already); with one, only if
                it returns `soft`.
            canvas: [B', L] the canvas the decoder just read.
            temperature: [B'] fp32, each row's temperature this step (spec D.4c).
            step: each row's step index in its canvas, 0-based (steps remaining = context.max_steps - step).
            generators: one `torch.Generator` per row (per_row samplers), or None.
            soft_embed: probs [..., V] -> self-conditioning input [..., H], when the sampler may build it from its
                own softmax (saves a pass); None: return soft=None.
        Returns:
            `StepOutput` (next canvas, argmax, accepted mask, entropy, optional soft embedding, optional state).

        A sampler that carries per-row state from step to step (which positions are committed, say) defines
        `init_state(batch, length, device) -> Tensor` (batch first); its `step` then also gets `state=` (the
        previous step's `StepOutput.state`, or `init_state`'s at the start of a canvas) and returns the next one.
        Without `init_state`, or with one that gives None (`BaseSampler`'s), a sampler is stateless and `step` gets
        no `state`.
        """


class BaseSampler:
    """A base for plug-in samplers (`register_sampler`): keeps `config` and `context`, starts a canvas from uniform
    noise and keeps no state between steps (`init_state` gives None, so `step` gets no `state=`). A subclass sets
    `per_row` and defines `step`; one that carries per-row state overrides `init_state` (see `Sampler`)."""

    per_row: bool  # set by the subclass: True draws only from the per-row `generators`, False from the global RNG

    def __init__(self, config, context: SamplerContext):
        self.config, self.context = config, context

    def init_canvas(self, batch: int, length: int, device: torch.device,
                    generators: Sequence[torch.Generator] | None) -> torch.Tensor:
        """[B', L] tokens uniform over the vocabulary: row b from generators[b], or from the global RNG (None)."""
        V = self.context.vocab_size
        if generators is None:
            return torch.randint(0, V, (batch, length), device=device)
        return torch.stack([torch.randint(0, V, (length,), generator=g, device=device) for g in generators])

    def init_state(self, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
        return None

    def step(self, logits: torch.Tensor, canvas: torch.Tensor, temperature: torch.Tensor, step: Sequence[int],
             generators: Sequence[torch.Generator] | None, soft_embed: SoftEmbed | None = None) -> StepOutput:
        raise NotImplementedError(f"{type(self).__name__} must define step (see diffusiongemma.generation.sampler"
                                  f".Sampler)")


def init_sampler_state(sampler, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
    """A stateful sampler's state at the start of a canvas (`Sampler.init_state`), or None for a stateless one."""
    init = getattr(sampler, "init_state", None)
    return init(batch, length, device) if init is not None else None


_SAMPLERS: dict[type, dict[str, type]] = {}  # sampler-config class -> {sampling name: sampler class}


def register_sampler(config_class: type, sampler_class: type, sampling: str = "fast") -> None:
    """Make `sampler_class` the sampler for `sampler_config` instances of `config_class` under `sampling` (the
    `sampling=` name of `generate`). The first name registered for a config class is its default. The config class
    also becomes loadable from `generation_config.json` (its `_cls_name`)."""
    if not isinstance(sampling, str) or not sampling:
        raise ValueError(f"`sampling` must be a non-empty string, got {sampling!r}")
    if not isinstance(getattr(sampler_class, "per_row", None), bool):
        raise TypeError(f"{sampler_class.__name__} must set the class attribute `per_row` (bool): whether it draws "
                        "from per-row generators (True) or the global RNG (False)")
    register_sampler_config(config_class)
    _SAMPLERS.setdefault(config_class, {})[sampling] = sampler_class


def sampling_names(config_class: type | None = None) -> list[str]:
    """The `sampling` names registered for `config_class` (default first), or for every class."""
    if config_class is None:
        return sorted({name for names in _SAMPLERS.values() for name in names})
    return list(_SAMPLERS.get(config_class, {}))


def sampler_names(sampler_config) -> list[tuple[str, type]]:
    """(sampling name, sampler class) pairs registered for this config's class, the default first."""
    return list(_SAMPLERS.get(type(sampler_config), {}).items())


def sampler_class_for(sampler_config, sampling: str | None) -> type:
    """The registered sampler class for this config and sampling name (None: the config class's default)."""
    names = _SAMPLERS.get(type(sampler_config))
    if names is None:
        known = sorted(c.__name__ for c in _SAMPLERS)
        raise ValueError(f"`sampler_config` is a {type(sampler_config).__name__}, which has no registered sampler "
                         f"(registered: {known}; see diffusiongemma.register_sampler)")
    if sampling is None:
        return next(iter(names.values()))
    if sampling not in names:
        raise ValueError(f"`sampling` must be one of {list(names)} for {type(sampler_config).__name__}, "
                         f"got {sampling!r}")
    return names[sampling]


def sampler_for(sampler_config, sampling: str | None, context: SamplerContext) -> Sampler:
    """Build the sampler once per `generate` call (or per distinct request settings in the server)."""
    return sampler_class_for(sampler_config, sampling)(sampler_config, context)


register_sampler(EntropyBoundSamplerConfig, ReferenceSampler, "reference")
register_sampler(EntropyBoundSamplerConfig, FastSampler, "fast")
register_sampler(EntropyBoundSamplerConfig, GumbelSampler, "gumbel")
# the commit-style samplers (diffusers' schedulers, mlx-vlm / Fast-dLLM): per-row generators by default; "reference"
# draws from the global RNG over the batch in diffusers' order
register_sampler(BlockRefinementSamplerConfig, BlockRefinementSampler, "fast")
register_sampler(BlockRefinementSamplerConfig, BlockRefinementReferenceSampler, "reference")
register_sampler(ConfidenceThresholdSamplerConfig, ConfidenceThresholdSampler, "fast")
register_sampler(ConfidenceThresholdSamplerConfig, ConfidenceThresholdReferenceSampler, "reference")
register_sampler(DiscreteDDIMSamplerConfig, DiscreteDDIMSampler, "fast")
register_sampler(DiscreteDDIMSamplerConfig, DiscreteDDIMReferenceSampler, "reference")
