"""Per-layer facts read off transformers' own `DiffusionGemmaConfig` (spec A).

We reuse transformers' config classes unchanged so that an unmodified `config.json` of the released checkpoint,
or one written by transformers' built-in class, loads as is. The text config is heterogeneous: full-attention
layers have their own head_dim and number of KV heads (spec A.2), read here through `per_layer_config`.
"""

import json
import math
import os
from dataclasses import dataclass

from transformers import DiffusionGemmaConfig
from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaTextConfig

__all__ = ["DiffusionGemmaConfig", "DiffusionGemmaTextConfig", "LayerShape", "check_config", "check_model_folder",
           "layer_shape"]

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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(field: str, value, allowed: str) -> ValueError:
    return ValueError(f"invalid DiffusionGemma config: `{field}` = {value!r}, expected {allowed}")


def check_config(config: DiffusionGemmaConfig) -> None:
    """Validate every field the model reads (spec A), before any weight is built.

    Raises:
        ValueError: naming the field, its value and what is allowed (a sub-field of the text config is named
            `text_config.<field>`).
    """
    if not isinstance(config, DiffusionGemmaConfig):
        raise TypeError(f"DiffusionGemma needs a DiffusionGemmaConfig, got {type(config).__name__} "
                        f"(model_type {getattr(config, 'model_type', None)!r})")
    text = config.text_config
    if not isinstance(text, DiffusionGemmaTextConfig):
        raise TypeError(f"`text_config` must be a DiffusionGemmaTextConfig, got {type(text).__name__}")
    canvas = getattr(config, "canvas_length", None)
    if not _is_int(canvas) or canvas <= 0:
        raise _bad("canvas_length", canvas, "a positive integer")
    sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "max_position_embeddings", "num_experts", "top_k_experts",
             "moe_intermediate_size")
    for name in sizes:
        value = getattr(text, name, None)
        if not _is_int(value) or value <= 0:
            raise _bad(f"text_config.{name}", value, "a positive integer")
    if text.top_k_experts > text.num_experts:
        raise _bad("text_config.top_k_experts", text.top_k_experts,
                   f"at most num_experts ({text.num_experts}): a token cannot pick more experts than exist")
    if canvas > text.max_position_embeddings:
        raise _bad("canvas_length", canvas, f"at most max_position_embeddings ({text.max_position_embeddings})")
    eps = text.rms_norm_eps
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
        raise _bad("text_config.rms_norm_eps", eps, "a finite number > 0")
    cap = text.final_logit_softcapping
    if cap is not None and (not isinstance(cap, (int, float)) or isinstance(cap, bool) or not math.isfinite(cap)
                            or cap <= 0):
        raise _bad("text_config.final_logit_softcapping", cap, "None (no cap) or a finite number > 0 (0 would divide "
                   "the logits by zero)")
    pad = text.pad_token_id
    if pad is not None and (not _is_int(pad) or not 0 <= pad < text.vocab_size):
        raise _bad("text_config.pad_token_id", pad, f"None or an id in [0, vocab_size={text.vocab_size})")
    _check_layers(text)


def _check_layers(text: DiffusionGemmaTextConfig) -> None:
    types = text.layer_types
    if not isinstance(types, (list, tuple)) or len(types) != text.num_hidden_layers:
        raise _bad("text_config.layer_types", types, f"a list of num_hidden_layers ({text.num_hidden_layers}) entries")
    for i, layer_type in enumerate(types):
        if layer_type not in (FULL, SLIDING):
            raise _bad(f"text_config.layer_types[{i}]", layer_type, f"{FULL!r} or {SLIDING!r}")
    window = text.sliding_window
    if SLIDING in types and (not _is_int(window) or window <= 0):
        raise _bad("text_config.sliding_window", window, "a positive integer (the window counts the query itself)")
    rope = text.rope_parameters
    for layer_type in set(types):
        params = rope.get(layer_type) if isinstance(rope, dict) else None
        theta = params.get("rope_theta") if isinstance(params, dict) else None
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not math.isfinite(theta) or theta <= 0:
            raise _bad(f"text_config.rope_parameters[{layer_type!r}].rope_theta", theta, "a finite number > 0")
    for i in range(len(types)):
        view = text.per_layer_config[i]
        heads, kv, dim = text.num_attention_heads, view.num_key_value_heads, view.head_dim
        if not _is_int(dim) or dim <= 0 or dim % 2:
            raise _bad(f"text_config.head_dim of layer {i}", dim, "a positive even integer (rotary halves)")
        if not _is_int(kv) or kv <= 0 or heads % kv:
            raise _bad(f"text_config.num_key_value_heads of layer {i}", kv,
                       f"a positive divisor of num_attention_heads ({heads})")


def looks_local(path: str) -> bool:
    """A path that cannot be a Hub repo id ("org/name" or "name"): absolute, relative with ./ ../ ~, or deeper."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def check_model_folder(path) -> None:
    """Before loading: a local folder must exist, hold config.json, and that config must be DiffusionGemma's.

    Raises:
        FileNotFoundError: no such folder, or no config.json in it. ValueError: config.json is not valid JSON, or it
        describes another model ("this folder holds a llama checkpoint, not DiffusionGemma").
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        if os.path.exists(path) or looks_local(path):
            raise FileNotFoundError(f"model folder {path} does not exist" if not os.path.exists(path)
                                    else f"{path} is a file, not a model folder")
        return  # a Hub repo id: transformers resolves it
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{path} holds no config.json, so it is not a saved model folder")
    try:
        with open(config_file) as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_file} is not valid JSON ({error})") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if model_type != DiffusionGemmaConfig.model_type:
        raise ValueError(f"this folder ({path}) holds a {model_type or 'unknown (no model_type)'} checkpoint, not "
                         f"DiffusionGemma (model_type {DiffusionGemmaConfig.model_type!r})")


def is_text_only_folder(path) -> bool:
    """Whether a local checkpoint folder's config.json says `"vision_config": null` (no vision tower or projector).

    transformers' `DiffusionGemmaConfig` fills in a default vision config when it reads null, so the choice is read
    from the file itself.
    """
    config_file = os.path.join(os.fspath(path), "config.json")
    if not os.path.isfile(config_file):
        return False
    with open(config_file) as f:
        data = json.load(f)
    return isinstance(data, dict) and "vision_config" in data and data["vision_config"] is None


def text_only_config(path, kwargs: dict) -> dict:
    """`from_pretrained` kwargs for a text-only folder: a config whose `vision_config` is None, so the model is built
    without a vision tower (instead of a default one left at random). Other folders: `kwargs` unchanged."""
    if "config" in kwargs or not is_text_only_folder(os.path.join(os.fspath(path), kwargs.get("subfolder") or "")):
        return kwargs
    config_kwargs = {k: kwargs[k] for k in ("subfolder", "revision", "cache_dir", "local_files_only") if k in kwargs}
    config = DiffusionGemmaConfig.from_pretrained(path, **config_kwargs)
    config.vision_config = None
    return {**kwargs, "config": config}
