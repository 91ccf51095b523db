"""DiffusionGemma block-diffusion language model for Hugging Face Transformers.

Importing this package registers `DiffusionGemmaForBlockDiffusion` for `AutoModelForCausalLM` with transformers'
`DiffusionGemmaConfig`, so `AutoModelForCausalLM.from_pretrained(path)` and `pipeline("text-generation", ...)` give
this implementation.
"""

from transformers import AutoModelForCausalLM

from .accuracy import Trace, load_trace
from .generation.config import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig
from .modeling import (
    BlockDiffusionCache,
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    DiffusionGemmaOutput,
    DiffusionGemmaTextConfig,
)

AutoModelForCausalLM.register(DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, exist_ok=True)

__version__ = "0.1.0"
__all__ = [
    "BlockDiffusionCache",
    "DiffusionGemmaConfig",
    "DiffusionGemmaForBlockDiffusion",
    "DiffusionGemmaGenerationConfig",
    "DiffusionGemmaOutput",
    "DiffusionGemmaTextConfig",
    "EntropyBoundSamplerConfig",
    "Trace",
    "load_trace",
]
