"""Samplers by name, with their settings from plain values: what the CLI (`--sampler NAME --sampler-setting K=V`) and
the server (a request's `sampler` and its fields) turn into a `sampler_config`.

A setting that is not a field of the named sampler's config, or a bad value, raises `SamplerSettingError` naming
that setting. JSON has no float type for whole numbers, so an int given for a float field (`threshold: 1`) is taken
as that float.
"""

import dataclasses
import math
import typing

from ..sampler_configs import EntropyBoundSamplerConfig, sampler_config_class, sampler_config_names
from .block_refinement import BlockRefinementSamplerConfig
from .confidence_threshold import ConfidenceThresholdSamplerConfig
from .discrete_ddim import DiscreteDDIMSamplerConfig

# the built-in samplers' short names (docs/samplers.md); any other registered config is named by its class name
SAMPLER_NAMES: dict[str, type] = {
    "entropy-bound": EntropyBoundSamplerConfig,
    "block-refinement": BlockRefinementSamplerConfig,
    "confidence-threshold": ConfidenceThresholdSamplerConfig,
    "discrete-ddim": DiscreteDDIMSamplerConfig,
}
DEFAULTS: dict[type, dict] = {EntropyBoundSamplerConfig: {"entropy_bound": 0.1}}  # transformers' has no default


class SamplerSettingError(ValueError):
    """A sampler name or setting is bad; `field` names it (the CLI flag's key, or the request's field)."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(message)


def known_sampler_names() -> list[str]:
    """Short names, then the class names of other registered sampler configs (user plug-ins)."""
    others = [n for n in sampler_config_names() if n not in {c.__name__ for c in SAMPLER_NAMES.values()}]
    return list(SAMPLER_NAMES) + others


def sampler_config_class_named(name: str, field: str = "sampler") -> type:
    """The config class for a short name (`block-refinement`) or a registered class name."""
    if name in SAMPLER_NAMES:
        return SAMPLER_NAMES[name]
    if isinstance(name, str) and name in sampler_config_names():
        return sampler_config_class(name)
    raise SamplerSettingError(field, f"unknown sampler {name!r}; known: {', '.join(known_sampler_names())}")


def sampler_name(config_class: type) -> str:
    """The name `sampler_config_class_named` takes for this class."""
    return next((n for n, c in SAMPLER_NAMES.items() if c is config_class), config_class.__name__)


def setting_names(config_class: type) -> list[str]:
    return [f.name for f in dataclasses.fields(config_class)]


def _float_fields(config_class: type) -> set[str]:
    hints = typing.get_type_hints(config_class)
    return {name for name, hint in hints.items() if hint is float or float in typing.get_args(hint)}


def sampler_config_from(config_class: type, settings: dict, base=None, kind: str = "sampler"):
    """`config_class(**fields)` from `settings` (name -> plain value) over `base`'s fields (when `base` is an
    instance of the class) or the defaults. Each setting is checked on its own first, so an error names it.
    kind: what the config configures, in messages ("sampler", or "stopper" for a stopper config).

    Raises:
        SamplerSettingError: a setting the class does not have, or a value its config refuses.
    """
    name = sampler_name(config_class)
    if not dataclasses.is_dataclass(config_class):
        raise SamplerSettingError(next(iter(settings), kind), f"the {name} {kind}'s config is not a dataclass, so its "
                                                              "settings cannot be given by name")
    known = setting_names(config_class)
    floats = _float_fields(config_class)
    start = dataclasses.asdict(base) if isinstance(base, config_class) else dict(DEFAULTS.get(config_class, {}))
    values = {}
    for key, value in settings.items():
        if key not in known:
            raise SamplerSettingError(key, f"`{key}` is not a setting of the {name} {kind} (its settings: "
                                           f"{', '.join(known) or 'none'})")
        if key in floats and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise SamplerSettingError(key, f"`{key}` must be finite, got {value!r}")
        try:
            config_class(**{**start, key: value})
        except (TypeError, ValueError) as error:
            raise SamplerSettingError(key, f"`{key}`: {error}") from None
        values[key] = value
    try:
        return config_class(**{**start, **values})
    except (TypeError, ValueError) as error:  # settings fine alone but not together, or a required one missing
        raise SamplerSettingError(next(iter(settings), kind), f"the {name} {kind}: {error}") from None
