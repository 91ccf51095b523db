"""Checkpoint prefixes and the one table mapping them onto our modules (spec B.1, B.2), for loading and saving.

Our module paths equal the checkpoint's, so the usual layout (text weights under `model.decoder.*`, written by the
upstream converter and by transformers' `save_pretrained`) loads and saves with no renaming at all. The reference also
accepts checkpoints whose text weights sit under `model.encoder.language_model.*` (the encoder side of its tied
pair); for those, `key_mapping_for` returns the renaming to pass to `from_pretrained`. Saving always writes the usual
layout. The quantized loader (`loading/compressed.py`) and the matching of quantization configs
(`quantization/schemes.py`) use the same table, through `key_mapping_for`, `renamed_key` and `checkpoint_names`.
"""

import json
import os
import re

from safetensors import safe_open

STACK_PREFIX = "model.decoder."  # the one text stack: our module path and the usual checkpoint prefix
ENCODER_TEXT_PREFIX = "model.encoder.language_model."  # the reference's encoder-side name for the same text weights

# The one table: checkpoint prefix -> where those tensors live in our model. Everything else (vision tower,
# `embed_vision`, `lm_head`) has the same name in both.
CHECKPOINT_PREFIXES = {
    STACK_PREFIX: STACK_PREFIX,  # usual layout: loaded and saved unchanged
    ENCODER_TEXT_PREFIX: STACK_PREFIX,  # encoder layout: the text weights the reference ties between its two stacks
}
# Names under the stack (relative to the prefix) that have no encoder-side twin: self-conditioning exists only in the
# decoder, and the per-layer `layer_scalar` buffers are not tied: the encoder-mode ones keep their own buffers at
# `model.encoder.language_model.layers.i.layer_scalar` (spec B.2).
LAYER_SCALAR = r"layers\.\d+\.layer_scalar$"
NOT_SHARED = re.compile("self_conditioning|" + LAYER_SCALAR)

# Encoder-side text weights -> the one stack, as a `from_pretrained(key_mapping=...)` regex; the encoder-mode layer
# scalars keep their own buffers.
ENCODER_LAYOUT_MAPPING = {
    "^" + re.escape(ENCODER_TEXT_PREFIX) + f"(?!{LAYER_SCALAR})": CHECKPOINT_PREFIXES[ENCODER_TEXT_PREFIX]
}


def checkpoint_names(name: str) -> tuple[str, ...]:
    """Every name a module or tensor of ours can have in a checkpoint or a quantization config: its own name, then,
    for a text-stack name shared by the reference's two stacks, the encoder-layout name.

    Example: `model.decoder.layers.0.mlp.up_proj` -> (that, `model.encoder.language_model.layers.0.mlp.up_proj`);
    `model.decoder.self_conditioning.up_proj` and `lm_head` -> themselves only.
    """
    if not name.startswith(STACK_PREFIX):
        return (name,)
    rest = name.removeprefix(STACK_PREFIX)
    if NOT_SHARED.match(rest):
        return (name,)
    return name, ENCODER_TEXT_PREFIX + rest


def renamed_key(key: str, mapping: dict[str, str] | None) -> str:
    """A checkpoint key renamed by a `key_mapping` (as transformers applies it): the name of our tensor."""
    for pattern, replacement in (mapping or {}).items():
        key = re.sub(pattern, replacement, key)
    return key


def checkpoint_shards(path: str) -> dict[str, str] | None:
    """{tensor name: shard file} of a local safetensors checkpoint folder (one file, or shards with an index), or None
    if `path` is not one."""
    if not os.path.isdir(path):
        return None
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        with safe_open(single, framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    return None


def checkpoint_keys(path: str) -> set[str] | None:
    """Tensor names of a local safetensors checkpoint folder, or None if `path` is not one."""
    shards = checkpoint_shards(path)
    return None if shards is None else set(shards)


def key_mapping_for(keys: set[str] | None) -> dict[str, str] | None:
    """The renaming a checkpoint needs: None for the usual layout, the encoder-layout mapping otherwise."""
    if not keys:
        return None
    has_stack = any(k.startswith(STACK_PREFIX + "layers.") and not k.endswith(".layer_scalar") for k in keys)
    has_encoder_text = any(
        k.startswith(ENCODER_TEXT_PREFIX) and not NOT_SHARED.match(k.removeprefix(ENCODER_TEXT_PREFIX)) for k in keys
    )
    return ENCODER_LAYOUT_MAPPING if has_encoder_text and not has_stack else None


def _listing(keys, shown: int = 12) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - shown} more" if len(keys) > shown else ""
    return f"{len(keys)}: {keys[:shown]}{more}"


def loading_problems(info: dict) -> list[str]:
    """Human-readable list of what went wrong in `from_pretrained`'s loading info (missing, mis-shaped, unexpected)."""
    problems = []
    if info.get("missing_keys"):
        problems.append(f"missing weights {_listing(info['missing_keys'])}")
    if info.get("mismatched_keys"):
        shown = [f"{k[0]} (checkpoint {tuple(k[1])}, model {tuple(k[2])})" if isinstance(k, tuple) and len(k) == 3
                 else str(k) for k in info["mismatched_keys"]]
        problems.append(f"weights with the wrong shape {_listing(shown)}")
    if info.get("unexpected_keys"):
        problems.append(f"unexpected weights {_listing(info['unexpected_keys'])}")
    if info.get("error_msgs"):
        problems.append(f"errors: {info['error_msgs']}")
    return problems
