"""Sampler configs by name: what `generation_config.json`'s `sampler_config` (`{"_cls_name": ..., fields}`) loads into.

A bottom-layer module (it imports only transformers), so the generation config can load any registered sampler config
without importing the samplers. `generation.sampler.register_sampler` registers a config class here as well.
"""

import dataclasses

from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

__all__ = ["EntropyBoundSamplerConfig", "check_sampler_config", "register_sampler_config", "sampler_config_class",
           "sampler_config_names"]

_CONFIGS: dict[str, type] = {"EntropyBoundSamplerConfig": EntropyBoundSamplerConfig}


def register_sampler_config(config_class: type) -> None:
    """Make `config_class` loadable by its class name. It needs `to_dict()` returning its fields plus `_cls_name`
    (a dataclass like transformers' `EntropyBoundSamplerConfig`), so it round-trips through save and load."""
    if not isinstance(config_class, type) or not callable(getattr(config_class, "to_dict", None)):
        raise TypeError(f"a sampler config class needs a `to_dict()` method (fields plus `_cls_name`), got "
                        f"{config_class!r}")
    known = _CONFIGS.get(config_class.__name__)
    if known is not None and known is not config_class:
        raise ValueError(f"another sampler config class is registered as {config_class.__name__!r} "
                         f"({known.__module__}); give yours another name")
    _CONFIGS[config_class.__name__] = config_class


def sampler_config_class(name: str) -> type:
    """The registered class called `name`, or a ValueError naming the registered ones."""
    if name not in _CONFIGS:
        raise ValueError(f"`sampler_config._cls_name` {name!r} is not a registered sampler config (registered: "
                         f"{sorted(_CONFIGS)}; register yours with diffusiongemma.register_sampler before loading)")
    return _CONFIGS[name]


def sampler_config_names() -> list[str]:
    return sorted(_CONFIGS)


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
