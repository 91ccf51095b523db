"""The one table of checkpoint prefixes (diffusiongemma/modeling/weights.py), spec B.1/B.2."""

import json

import torch
from safetensors.torch import save_file

from conftest import tiny_model
from diffusiongemma.modeling.weights import (
    ENCODER_LAYOUT_MAPPING,
    checkpoint_keys,
    checkpoint_names,
    checkpoint_shards,
    key_mapping_for,
    renamed_key,
)


def test_checkpoint_names_add_the_encoder_side_name_of_shared_text_weights_only():
    up = "model.decoder.layers.0.mlp.up_proj"
    assert checkpoint_names(up) == (up, "model.encoder.language_model.layers.0.mlp.up_proj")
    assert checkpoint_names("model.decoder.norm.weight")[-1] == "model.encoder.language_model.norm.weight"
    # decoder-only, untied or outside the stack: one name (spec B.2)
    for name in ("model.decoder.self_conditioning.up_proj", "model.decoder.self_conditioning",
                 "model.decoder.layers.11.layer_scalar", "lm_head", "model.encoder.vision_tower.encoder",
                 "model.encoder.language_model.layers.0.layer_scalar"):
        assert checkpoint_names(name) == (name,)


def test_key_mapping_only_for_the_encoder_layout():
    usual = {"model.decoder.layers.0.self_attn.q_proj.weight", "model.encoder.language_model.layers.0.layer_scalar"}
    encoder = {"model.encoder.language_model.layers.0.self_attn.q_proj.weight",
               "model.encoder.language_model.layers.0.layer_scalar", "model.decoder.layers.0.layer_scalar"}
    assert key_mapping_for(usual) is None and key_mapping_for(None) is None
    assert key_mapping_for(encoder) is ENCODER_LAYOUT_MAPPING


def test_encoder_layout_names_load_back_into_our_keys():
    """Every tensor of ours, written under its encoder-layout name, is renamed back to itself by the mapping."""
    state = tiny_model().state_dict()
    stored = {checkpoint_names(k)[-1]: k for k in state}
    assert len(stored) == len(state)  # no two of our tensors share a checkpoint name
    assert key_mapping_for(set(stored)) is ENCODER_LAYOUT_MAPPING
    moved = 0
    for ckpt_key, ours in stored.items():
        assert renamed_key(ckpt_key, ENCODER_LAYOUT_MAPPING) == ours
        moved += ckpt_key != ours
    # tied text weights moved; self-conditioning, layer scalars, vision and lm_head kept their names
    assert moved == sum(k.startswith("model.decoder.") and "self_conditioning" not in k
                        and not k.endswith("layer_scalar") for k in state) > 0
    assert renamed_key("model.encoder.language_model.layers.3.layer_scalar", ENCODER_LAYOUT_MAPPING) \
        == "model.encoder.language_model.layers.3.layer_scalar"


def test_checkpoint_shards_of_single_and_sharded_folders(tmp_path):
    single = tmp_path / "single"
    single.mkdir()
    save_file({"a": torch.zeros(1), "b": torch.ones(2)}, str(single / "model.safetensors"))
    assert checkpoint_shards(str(single)) == {"a": str(single / "model.safetensors"),
                                              "b": str(single / "model.safetensors")}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}))
    assert checkpoint_shards(str(sharded)) == {"a": str(sharded / "part-1.safetensors"),
                                               "b": str(sharded / "part-2.safetensors")}
    assert checkpoint_keys(str(sharded)) == {"a", "b"}
    assert checkpoint_shards(str(tmp_path)) is None and checkpoint_keys(str(tmp_path / "missing")) is None
