"""Generation settings: transformers' `DiffusionGemmaGenerationConfig` with strict, clear validation (spec A.5, D.1).

The bottom layer (it imports only transformers, `sampler_configs` and `stopper_configs`): the network (`modeling/`)
and generation both read it. `diffusiongemma.generation.config` re-exports it.

We subclass transformers' class so `generation_config.json` files load and save identically in both directions;
only `validate` differs: every bad value raises a `ValueError` naming the field and what was expected (the built-in
raises AttributeError for bad thresholds and lets booleans pass as integers).
"""

import copy
import math
from numbers import Real

from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig as _BuiltinGenerationConfig,
)

from .sampler_configs import (
    EntropyBoundSamplerConfig,
    check_sampler_config,
    sampler_config_class,
    sampler_config_names,
)
from .stopper_configs import stopper_config_class, stopper_config_names

__all__ = ["DiffusionGemmaGenerationConfig", "EntropyBoundSamplerConfig", "GLOBAL_DEFAULTS", "MAX_DENOISING_STEPS",
           "MAX_STABILITY_THRESHOLD", "resolve_generation_config", "validate_field"]

# spec A.5: applied at generate time to fields that neither the model's config nor the call set
GLOBAL_DEFAULTS = {
    "max_new_tokens": 256,
    "max_denoising_steps": 48,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
}
DEFAULT_ENTROPY_BOUND = 0.1
FP32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
# Documented upper bounds (docs/errors.md). The released config takes 48 steps; a bound keeps one request (a server
# row, a CLI call) from allocating or looping without end: the temperature schedule holds N + 1 floats and the step
# counters are int32 on the device.
MAX_DENOISING_STEPS = 100_000
# A canvas stops on stability only after S + 1 equal argmax canvases, so any S >= max_denoising_steps means "never
# stop on stability"; the bound only keeps the value representable (the stopper compares it on the device).
MAX_STABILITY_THRESHOLD = MAX_DENOISING_STEPS
MAX_NEW_TOKENS = 2**31 - 1  # token counts and positions are int32/int64 on the device; nothing longer fits a model


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


class DiffusionGemmaGenerationConfig(_BuiltinGenerationConfig):
    """Settings of block-diffusion `generate` (fields as in transformers' class of the same name).

    Fields: max_new_tokens, max_length, max_denoising_steps, sampler_config (`EntropyBoundSamplerConfig`), t_min,
    t_max, stability_threshold, confidence_threshold, eos_token_id, pad_token_id, bos_token_id,
    return_dict_in_generate, cache_implementation, cache_config, disable_compile; and ours, `stopper_config`: a
    registered plug-in stopper's config (`diffusiongemma.register_stopper`), or None for the built-in
    stable-and-confident stopper (set by `stability_threshold` and `confidence_threshold`). It is saved only when
    set, so a config without one stays loadable by transformers' own class.
    """

    def __init__(self, **kwargs):
        self.stopper_config = kwargs.pop("stopper_config", None)  # before the built-in's __init__ validates
        super().__init__(**kwargs)

    def to_dict(self) -> dict:
        out = super().to_dict()
        if out.get("stopper_config", False) is None:
            del out["stopper_config"]
        return out

    def validate(self, **unused_kwargs) -> None:
        for name in ("max_denoising_steps", "max_new_tokens", "max_length", "t_min", "t_max", "stability_threshold",
                     "confidence_threshold"):
            validate_field(name, getattr(self, name))
        if self.sampler_config is not None and (
            isinstance(self.sampler_config, dict) or type(self.sampler_config).__name__ not in sampler_config_names()
            or sampler_config_class(type(self.sampler_config).__name__) is not type(self.sampler_config)
        ):
            raise ValueError(
                f"`sampler_config` must be a registered sampler config ({', '.join(sampler_config_names())}; see "
                f"diffusiongemma.register_sampler), got {type(self.sampler_config).__name__}"
            )
        stopper = getattr(self, "stopper_config", None)
        if stopper is not None and (
            isinstance(stopper, dict) or type(stopper).__name__ not in stopper_config_names()
            or stopper_config_class(type(stopper).__name__) is not type(stopper)
        ):
            raise ValueError(
                f"`stopper_config` must be None (the built-in stopper, set by `stability_threshold` and "
                f"`confidence_threshold`) or a registered stopper config ({', '.join(stopper_config_names()) or 'none'}"
                f"; see diffusiongemma.register_stopper), got {type(stopper).__name__}"
            )
        if self.t_min is not None and self.t_max is not None and not self.t_max > self.t_min:
            raise ValueError(f"`t_max` must be greater than `t_min`, got t_max={self.t_max} <= t_min={self.t_min}")
        bound = getattr(self.sampler_config, "entropy_bound", None)
        if isinstance(self.sampler_config, EntropyBoundSamplerConfig) and (
            not isinstance(bound, float) or not math.isfinite(bound) or bound <= 0
        ):
            raise ValueError(f"`sampler_config.entropy_bound` must be a finite float > 0, got {bound!r}")
        if self.sampler_config is not None:
            check_sampler_config(self.sampler_config, self.max_denoising_steps)  # fields changed after construction
        if stopper is not None:
            check_sampler_config(stopper, None)  # the same re-check: a dataclass stopper config's own checks
        if self.cache_implementation not in (None, "dynamic"):
            raise ValueError(
                f"`cache_implementation` must be None or 'dynamic' (diffusiongemma keeps its own block cache), "
                f"got {self.cache_implementation!r}"
            )
        for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, (list, tuple)) else [value]
            if value is not None and not all(_is_int(i) and i >= 0 for i in ids):
                raise ValueError(f"`{name}` must be a non-negative integer (or a list for eos), got {value!r}")

    def _resolve_dataclasses(self) -> None:
        """A saved `sampler_config` / `stopper_config` (its fields plus `_cls_name`) back into its class: any
        registered config (`diffusiongemma.register_sampler` / `register_stopper`), not only the built-in's own."""
        for attr_name, class_named in (("sampler_config", sampler_config_class),
                                       ("stopper_config", stopper_config_class)):
            attr = getattr(self, attr_name, None)
            if isinstance(attr, dict):
                fields = dict(attr)
                name = fields.pop("_cls_name", None)
                if name is None:
                    raise ValueError(f"`{attr_name}` given as a dict needs its `_cls_name` (the config class)")
                setattr(self, attr_name, class_named(name)(**fields))

    @classmethod
    def from_builtin(cls, config: _BuiltinGenerationConfig) -> "DiffusionGemmaGenerationConfig":
        return cls(**{k: v for k, v in config.to_dict().items() if k != "sampler_config"},
                   sampler_config=config.sampler_config)


def validate_field(name: str, value) -> None:
    """Check one scalar field on its own (its type and range; not the t_min < t_max pair). None passes.

    Raises:
        ValueError: naming the field, what was expected and the value.
    """
    if value is None:
        return
    upper = {"max_denoising_steps": MAX_DENOISING_STEPS, "max_new_tokens": MAX_NEW_TOKENS,
             "max_length": MAX_NEW_TOKENS}
    if name in upper:
        if not _is_int(value) or value <= 0:
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if value > upper[name]:
            raise ValueError(f"`{name}` must be at most {upper[name]}, got {value!r}")
    elif name in ("t_min", "t_max"):
        if not _is_real(value) or not math.isfinite(value) or value < 0 or value > FP32_MAX:
            raise ValueError(f"`{name}` must be a finite number >= 0 (at most {FP32_MAX:.3g}: the schedule runs in "
                             f"float32), got {value!r}")
    elif name == "stability_threshold":
        if not _is_int(value) or value < 0:
            raise ValueError(f"`stability_threshold` must be an integer >= 0, got {value!r}")
        if value > MAX_STABILITY_THRESHOLD:
            raise ValueError(f"`stability_threshold` must be at most {MAX_STABILITY_THRESHOLD}, got {value!r}")
    elif name == "confidence_threshold":
        if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"`confidence_threshold` must be a finite float > 0, got {value!r}")
    else:
        raise KeyError(f"validate_field does not check {name!r}")


def resolve_generation_config(
    model_config: _BuiltinGenerationConfig | None,
    generation_config: _BuiltinGenerationConfig | None,
    kwargs: dict,
) -> tuple[DiffusionGemmaGenerationConfig, dict, set]:
    """Spec D.1: explicit config (or the model's), filled from the model's, then global defaults, then kwargs.

    Returns:
        (validated config, kwargs that are not config fields, names of config fields set explicitly by kwargs)
    """
    base = generation_config if generation_config is not None else model_config
    config = copy.deepcopy(base) if base is not None else DiffusionGemmaGenerationConfig()
    if not isinstance(config, DiffusionGemmaGenerationConfig):
        if not isinstance(config, _BuiltinGenerationConfig):
            raise ValueError(
                "`generation_config` must be a DiffusionGemmaGenerationConfig, got " f"{type(config).__name__}"
            )
        config = DiffusionGemmaGenerationConfig.from_builtin(config)
    if model_config is not None and model_config is not base:
        for key, value in model_config.to_dict().items():
            if getattr(config, key, None) is None and key in config.__dict__:
                setattr(config, key, copy.deepcopy(getattr(model_config, key)))
    for key, value in GLOBAL_DEFAULTS.items():
        if getattr(config, key) is None:
            setattr(config, key, value)
    if config.sampler_config is None:
        config.sampler_config = EntropyBoundSamplerConfig(entropy_bound=DEFAULT_ENTROPY_BOUND)
    if not hasattr(config, "stopper_config"):  # a config unpickled from before the field
        config.stopper_config = None
    explicit = {k for k in kwargs if k in config.__dict__ and not k.startswith("_")}
    rest = {k: v for k, v in kwargs.items() if k not in explicit}
    for key in explicit:
        setattr(config, key, kwargs[key])
    if isinstance(config.sampler_config, dict) or isinstance(config.stopper_config, dict):
        config._resolve_dataclasses()
    config.validate()
    check_stopper_fields(config, explicit)
    return config, rest, explicit


BUILTIN_STOPPER_FIELDS = ("stability_threshold", "confidence_threshold")


def check_stopper_fields(config, given) -> None:
    """The built-in stopper's fields set together with a plug-in `stopper_config` would be ignored: refused.
    given: the names the caller set explicitly."""
    ignored = [n for n in BUILTIN_STOPPER_FIELDS if n in given]
    if config.stopper_config is not None and ignored:
        raise ValueError(f"`{ignored[0]}` sets the built-in stopper, but this run's `stopper_config` is a "
                         f"{type(config.stopper_config).__name__}: set that config's fields instead (or pass "
                         f"stopper_config=None)")
