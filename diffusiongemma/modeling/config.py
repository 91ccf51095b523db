"""Per-layer facts read off transformers' own `DiffusionGemmaConfig` (spec A).

We reuse transformers' config classes unchanged so that an unmodified `config.json` of the released checkpoint,
or one written by transformers' built-in class, loads as is. The text config is heterogeneous: full-attention
layers have their own head_dim and number of KV heads (spec A.2), read here through `per_layer_config`.
"""

from dataclasses import dataclass

from transformers import DiffusionGemmaConfig
from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaTextConfig

__all__ = ["DiffusionGemmaConfig", "DiffusionGemmaTextConfig", "LayerShape", "layer_shape"]

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass(frozen=True)
class LayerShape:
    """Attention geometry of one text layer.

    Attributes:
        layer_type: "full_attention" or "sliding_attention".
        head_dim: Dh of this layer (spec A.4: 256 sliding, 512 full for 26B-A4B).
        num_kv_heads: K of this layer (8 sliding, 2 full for 26B-A4B).
        sliding_window: W for sliding layers (the window counts the query itself, spec C.4), None for full layers.
        rope: the rope parameter dict of this layer type (spec A.2 step 4).
    """

    layer_type: str
    head_dim: int
    num_kv_heads: int
    sliding_window: int | None
    rope: dict

    @property
    def is_sliding(self) -> bool:
        return self.layer_type == SLIDING


def layer_shape(text_config: DiffusionGemmaTextConfig, layer_idx: int) -> LayerShape:
    """Resolve the attention geometry of layer `layer_idx` from a (heterogeneous) text config."""
    layer_type = text_config.layer_types[layer_idx]
    if layer_type not in (FULL, SLIDING):
        raise ValueError(
            f"`layer_types[{layer_idx}]` must be {FULL!r} or {SLIDING!r} for DiffusionGemma, got {layer_type!r}"
        )
    view = text_config.per_layer_config[layer_idx]
    sliding = layer_type == SLIDING
    return LayerShape(
        layer_type=layer_type,
        head_dim=int(view.head_dim),
        num_kv_heads=int(view.num_key_value_heads),
        sliding_window=int(text_config.sliding_window) if sliding else None,
        rope=dict(text_config.rope_parameters[layer_type]),
    )


def encoder_is_causal(text_config: DiffusionGemmaTextConfig) -> bool:
    """Spec A.2 step 1: only `use_bidirectional_attention == "all"` makes the encoder non-causal."""
    return getattr(text_config, "use_bidirectional_attention", None) != "all"
