"""DiffusionGemma block-diffusion language model for Hugging Face Transformers.

Importing this package registers `DiffusionGemmaForBlockDiffusion` for `AutoModelForCausalLM` and
`AutoModelForImageTextToText` with transformers' `DiffusionGemmaConfig`, so
`AutoModelForCausalLM.from_pretrained(path)`, `pipeline("text-generation", ...)` and
`pipeline("image-text-to-text", ...)` give this implementation, for bf16, compressed-tensors (FP8, NVFP4) and
bitsandbytes checkpoints alike (and `AutoProcessor` a text-and-image
`Gemma4Processor`, see `diffusiongemma.processing`). A load that fails under `pipeline` raises `PipelineLoadError`
rather than letting the pipeline retry with transformers' built-in class.
"""

from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

from .accuracy import Trace, load_trace
from .constraints import ConstraintError, JsonSchema, Regex, ToolCalls, parse_tool_calls
from .generation.config import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig
from .model import DiffusionGemmaForBlockDiffusion, PipelineLoadError
from .modeling import BlockDiffusionCache, DiffusionGemmaConfig, DiffusionGemmaOutput, DiffusionGemmaTextConfig
from .generation.sampler import (
    BaseSampler,
    BlockRefinementSamplerConfig,
    ConfidenceThresholdSamplerConfig,
    DiscreteDDIMSamplerConfig,
    SamplerContext,
    StepOutput,
    register_sampler,
)
from .generation.stopping import BaseStopper, register_stopper
from .generation.sampler_presets import SAMPLER_PRESETS, sampler_preset
from .processing import DiffusionGemmaProcessor, load_processor
from .training.collator import DiffusionGemmaDataCollator
from .version import __version__

AutoModelForCausalLM.register(DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, exist_ok=True)
AutoModelForImageTextToText.register(DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, exist_ok=True)
AutoProcessor.register(DiffusionGemmaConfig, DiffusionGemmaProcessor, exist_ok=True)

__all__ = [
    "BaseSampler",
    "BaseStopper",
    "BlockDiffusionCache",
    "BlockRefinementSamplerConfig",
    "ConfidenceThresholdSamplerConfig",
    "ConstraintError",
    "DiffusionGemmaConfig",
    "DiffusionGemmaDataCollator",
    "DiffusionGemmaForBlockDiffusion",
    "DiffusionGemmaGenerationConfig",
    "DiffusionGemmaOutput",
    "DiffusionGemmaProcessor",
    "DiffusionGemmaTextConfig",
    "DiscreteDDIMSamplerConfig",
    "EntropyBoundSamplerConfig",
    "JsonSchema",
    "PipelineLoadError",
    "Regex",
    "SAMPLER_PRESETS",
    "SamplerContext",
    "StepOutput",
    "ToolCalls",
    "Trace",
    "load_processor",
    "load_trace",
    "parse_tool_calls",
    "register_sampler",
    "register_stopper",
    "sampler_preset",
]
