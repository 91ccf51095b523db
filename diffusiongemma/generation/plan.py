"""The one plan builder: how rows denoise (`engine.Plan`: sampler, stopper, temperature schedule, processors,
self-conditioning input, constraint), built from a generation config in this one place.

Every caller builds its plans here: `generate` (once per call), the server (once per distinct request settings,
serving/scheduler.py) and `compare`'s replay (from the trace's recorded settings, accuracy/replay.py). So a sampler,
a stopper or a schedule means the same thing wherever it runs.
"""

import torch
from transformers import LogitsProcessorList

from ..constraints.guide import ConstraintGuide
from .engine import Plan, soft_embedder
from .sampler import Sampler, SamplerContext, sampler_class_for, temperature_schedule
from .stopping import stopper_for


def build_sampler(config, sampling: str | None, vocab_size: int) -> Sampler:
    """The registered sampler of `config.sampler_config` under this sampling name (None: the config's default)."""
    sampler_class = sampler_class_for(config.sampler_config, sampling)
    return sampler_class(config.sampler_config, SamplerContext(vocab_size, config.max_denoising_steps))


def build_plan(model, config, sampling: str | None = None, device: torch.device | str | None = None,
               processors: LogitsProcessorList | None = None, automaton=None, max_new_tokens: int = 0,
               sampler: Sampler | None = None) -> Plan:
    """The `Plan` of a generation config.

    Args:
        model: the `DiffusionGemmaForBlockDiffusion` (its vocabulary, canvas length, embedding dtype).
        config: a `DiffusionGemmaGenerationConfig` (sampler config, steps, t_min/t_max, stopper thresholds).
        sampling: the registered sampling name (None: the sampler config's default).
        device: where the temperature schedule lives (default: the model's device).
        processors: the user's logits processors, or None.
        automaton: a compiled constraint (`constraints.TokenAutomaton`) with `max_new_tokens` its budget, or None.
        sampler: an already built sampler (`generate` builds it while resolving), else one is built here.
    Returns:
        the `engine.Plan`.
    """
    if sampler is None:
        sampler = build_sampler(config, sampling, model.config.text_config.vocab_size)
    device = device if device is not None else model.device
    return Plan(
        sampler=sampler, stopper=stopper_for(config), max_steps=config.max_denoising_steps,
        temperatures=temperature_schedule(config.max_denoising_steps, config.t_min, config.t_max, device),
        processors=processors or None,
        soft_embed=soft_embedder(model.get_decoder(), exact_reference=not sampler.per_row),
        constraint=(ConstraintGuide(automaton, model.canvas_length, max_new_tokens) if automaton is not None
                    else None),
    )
