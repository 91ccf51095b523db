"""The generation config, re-exported from its bottom-layer home `diffusiongemma.generation_config`."""

from ..generation_config import (  # noqa: F401
    DEFAULT_ENTROPY_BOUND,
    GLOBAL_DEFAULTS,
    DiffusionGemmaGenerationConfig,
    EntropyBoundSamplerConfig,
    resolve_generation_config,
)

__all__ = ["DiffusionGemmaGenerationConfig", "EntropyBoundSamplerConfig", "GLOBAL_DEFAULTS", "resolve_generation_config"]
