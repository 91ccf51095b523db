"""Sampler configs by name: what `generation_config.json`'s `sampler_config` (`{"_cls_name": ..., fields}`) loads into.

A bottom-layer module (it imports transformers and, of ours, only `config_registry.py`), so the generation config can load any registered sampler config
without importing the samplers. `generation.sampler.register_sampler` registers a config class here as well.
"""

import dataclasses

from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

from .config_registry import ConfigRegistry

__all__ = ["EntropyBoundSamplerConfig", "check_sampler_config", "register_sampler_config", "sampler_config_class",
           "sampler_config_names"]

_REGISTRY = ConfigRegistry("sampler", "register_sampler", {"EntropyBoundSamplerConfig": EntropyBoundSamplerConfig})


def register_sampler_config(config_class: type) -> None:
    """Make `config_class` loadable by its class name (see `ConfigRegistry.register`)."""
    _REGISTRY.register(config_class)


def sampler_config_class(name: str) -> type:
    """The registered class called `name`, or a ValueError naming the registered ones."""
    return _REGISTRY.lookup(name)


def sampler_config_names() -> list[str]:
    return _REGISTRY.names()


def check_sampler_config(config, max_denoising_steps: int | None) -> None:
    """Check a sampler config again where it is used (`generate`, the server): its fields may have been changed
    after it was built (`config.threshold = float("nan")`), which its `__post_init__` never saw. A dataclass config
    is rebuilt from its current fields, so its own checks run again; a config with `check_step_budget(N)` is also
    checked against the run's step budget N (`max_denoising_steps`).

    Raises:
        ValueError: the config's own message, which names the field.
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        dataclasses.replace(config)  # runs __post_init__ on the current fields
    check = getattr(config, "check_step_budget", None)
    if callable(check) and max_denoising_steps is not None:
        check(max_denoising_steps)
