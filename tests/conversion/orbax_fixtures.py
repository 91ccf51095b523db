"""Synthetic Orbax checkpoints for the conversion tests: a tiny random model's weights, run backwards through the rule
table and written by orbax-checkpoint itself, in the release's `params/transformer/...` layout (spec G)."""

import copy

import numpy as np
import pytest
import torch
from conftest import tiny_config, tiny_model

from diffusiongemma.conversion.synthetic import orbax_tree_from_state_dict, write_orbax_checkpoint

pytest.importorskip("orbax.checkpoint",
                    reason="the conversion tests need the convert extra: pip install -e '.[convert]'")


def source_model(config=None, seed: int = 0):
    """A tiny random model whose encoder-mode layer scalars equal the decoder's (the release stores one per layer)."""
    model = tiny_model(config or tiny_config(), seed)
    state = model.state_dict()  # shares storage with the model
    with torch.no_grad():
        for i in range(model.config.text_config.num_hidden_layers):
            state[f"model.encoder.language_model.layers.{i}.layer_scalar"].copy_(
                state[f"model.decoder.layers.{i}.layer_scalar"])
    return model


def write_checkpoint(path, model, config, text_only: bool = False, dtype: str = "float32", edit=None,
                     chunk_bytes=None):
    """Write `model`'s weights as an Orbax checkpoint at `path`; `edit(tree)` may change the tree first;
    `chunk_bytes`: storage chunk size (None: one chunk per array)."""
    tree = orbax_tree_from_state_dict(model.state_dict(), config, text_only=text_only, dtype=dtype)
    if edit is not None:
        tree = copy.deepcopy(tree)
        edit(tree["params"])
    write_orbax_checkpoint(tree, path, chunk_bytes)
    return path


def node(tree: dict, path: str):
    """The dict holding the last key of `path` ("transformer/layer_1/attn/q_einsum/w") and that key."""
    *parents, leaf = path.split("/")
    for key in parents:
        tree = tree[key]
    return tree, leaf


def bf16(value: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(value, np.float32)).to(torch.bfloat16)
