"""Convert the original Orbax (JAX) release of DiffusionGemma into the Hugging Face layout, streaming (spec G).

    diffusiongemma convert orbax SRC DST [--config CONFIG.json] [--dtype bfloat16] [--text-only] ...
    diffusiongemma convert verify SRC DST

Parts: `rules` (the name/transform table, as data), `orbax` (the reader), `plan` (matching the table against a
checkpoint), `transform` (one rule applied in slices), `safetensors_stream` (the writer), `convert`, `verify`,
`synthetic` (Orbax checkpoints from a state dict, for tests, docs and the benchmark). Reading needs TensorStore, and
writing synthetic checkpoints orbax-checkpoint: `pip install "diffusiongemma[convert]"`.
"""

from .convert import RELEASED_CONFIG, RELEASED_GENERATION_CONFIG, convert_orbax, load_config
from .plan import ConversionError
from .rules import RULES, Rule, expand_rules
from .verify import verify_conversion

__all__ = ["RELEASED_CONFIG", "RELEASED_GENERATION_CONFIG", "RULES", "ConversionError", "Rule", "convert_orbax",
           "expand_rules", "load_config", "verify_conversion"]
