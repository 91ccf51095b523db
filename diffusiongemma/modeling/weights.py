"""Checkpoint prefixes and the one table mapping them onto our modules (spec B.1, B.2).

Our module paths equal the checkpoint's, so the usual layout (text weights under `model.decoder.*`, written by the
upstream converter and by transformers' `save_pretrained`) loads and saves with no renaming at all. The reference also
accepts checkpoints whose text weights sit under `model.encoder.language_model.*` (the encoder side of its tied
pair); for those, `key_mapping_for` returns the renaming to pass to `from_pretrained`. Saving always writes the usual
layout.
"""

import json
import os
import re

from safetensors import safe_open

STACK_PREFIX = "model.decoder."
ENCODER_TEXT_PREFIX = "model.encoder.language_model."
ENCODER_SCALAR = re.compile(r"^model\.encoder\.language_model\.layers\.\d+\.layer_scalar$")

# Encoder-side text weights -> the one stack; the encoder-mode layer scalars keep their own buffers (spec B.2).
ENCODER_LAYOUT_MAPPING = {r"^model\.encoder\.language_model\.(?!layers\.\d+\.layer_scalar$)": STACK_PREFIX}


def checkpoint_keys(path: str) -> set[str] | None:
    """Tensor names of a local safetensors checkpoint folder, or None if `path` is not one."""
    if not os.path.isdir(path):
        return None
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return set(json.load(f)["weight_map"])
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        with safe_open(single, framework="pt") as f:
            return set(f.keys())
    return None


def key_mapping_for(keys: set[str] | None) -> dict[str, str] | None:
    """The renaming a checkpoint needs: None for the usual layout, the encoder-layout mapping otherwise."""
    if not keys:
        return None
    has_stack = any(k.startswith(STACK_PREFIX + "layers.") and not k.endswith(".layer_scalar") for k in keys)
    has_encoder_text = any(k.startswith(ENCODER_TEXT_PREFIX) and not ENCODER_SCALAR.match(k) for k in keys)
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
