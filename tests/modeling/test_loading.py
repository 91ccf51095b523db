"""Loading checkpoints written by transformers' built-in class, saving the same layout back, strict errors."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers import DiffusionGemmaForBlockDiffusion as BuiltinModel

from conftest import tiny_builtin, tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion


def same_weights(reference: torch.nn.Module, ours: torch.nn.Module) -> bool:
    """Every tensor of ours equals the reference's tensor of the same name (the built-in has extra tied names)."""
    sa, sb = reference.state_dict(), ours.state_dict()
    return all(k in sa and torch.equal(sa[k], sb[k]) for k in sb)


def test_loads_builtin_folder_with_nothing_missing(saved_pair):
    path, builtin, _ = saved_pair
    model, info = DiffusionGemmaForBlockDiffusion.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert same_weights(builtin, model)
    # one stack: the decoder-mode and encoder-mode passes share every text weight but the layer scalars
    assert not any(k.startswith("model.encoder.language_model.layers.0.self_attn") for k in model.state_dict())


def test_save_writes_builtin_layout_and_builtin_loads_it(tmp_path):
    ours = tiny_model(seed=4)
    ours.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in saved  # tied to the embeddings (spec B.2)
    assert "model.decoder.layers.0.experts.gate_up_proj" in saved
    assert "model.encoder.language_model.layers.0.layer_scalar" in saved
    assert not any(k.startswith("model.encoder.language_model.layers.0.self_attn") for k in saved)
    builtin = BuiltinModel.from_pretrained(tmp_path)
    # compare on the built-in's own names: every ours tensor must land in the built-in
    sb = builtin.state_dict()
    for key, value in ours.state_dict().items():
        assert torch.equal(sb[key], value), key
    ids = torch.randint(3, 128, (1, 9))
    canvas = torch.randint(0, 128, (1, 16))
    with torch.no_grad():
        diff = builtin(input_ids=ids, decoder_input_ids=canvas).logits - ours(input_ids=ids, decoder_input_ids=canvas).logits
    assert diff.abs().max() <= 1e-4


def test_round_trip_ours(tmp_path):
    ours = tiny_model(seed=5)
    ours.save_pretrained(tmp_path, max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").exists()  # sharded
    again = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, device_map="cpu", low_cpu_mem_usage=True)
    assert same_weights(ours, again)
    assert again.lm_head.weight.data_ptr() == again.model.decoder.embed_tokens.weight.data_ptr()


def test_encoder_side_layout_loads_to_identical_weights(tmp_path):
    builtin = tiny_builtin(seed=6)
    builtin.save_pretrained(tmp_path / "src")
    state = load_file(tmp_path / "src" / "model.safetensors")
    moved = {}
    for key, value in state.items():
        text = key.startswith("model.decoder.") and "self_conditioning" not in key and "layer_scalar" not in key
        moved[("model.encoder.language_model." + key[len("model.decoder."):]) if text else key] = value
    os.makedirs(tmp_path / "enc")
    save_file(moved, tmp_path / "enc" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "enc" / "config.json").write_text((tmp_path / "src" / "config.json").read_text())
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "enc")
    assert same_weights(builtin, model)
    model.save_pretrained(tmp_path / "again")  # saves the usual layout
    assert "model.decoder.layers.0.self_attn.q_proj.weight" in load_file(tmp_path / "again" / "model.safetensors")


def _rewrite(src, dst, edit):
    os.makedirs(dst)
    state = load_file(src / "model.safetensors")
    edit(state)
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())


def test_missing_weight_fails_naming_the_key(tmp_path, saved_pair):
    src = saved_pair[0]
    _rewrite(src, tmp_path / "bad", lambda s: s.pop("model.decoder.layers.2.experts.down_proj"))
    with pytest.raises(ValueError, match=r"missing weights.*model\.decoder\.layers\.2\.experts\.down_proj"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "bad")


def test_misshaped_weight_fails_naming_the_key(tmp_path, saved_pair):
    src = saved_pair[0]

    def shrink(state):
        state["model.decoder.layers.1.self_attn.q_proj.weight"] = state["model.decoder.layers.1.self_attn.q_proj.weight"][:8]

    _rewrite(src, tmp_path / "bad", shrink)
    with pytest.raises(ValueError, match=r"model\.decoder\.layers\.1\.self_attn\.q_proj\.weight"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "bad")


def test_unexpected_weight_fails_unless_not_strict(tmp_path, saved_pair):
    src = saved_pair[0]
    _rewrite(src, tmp_path / "bad", lambda s: s.__setitem__("model.decoder.extra.weight", torch.zeros(2)))
    with pytest.raises(ValueError, match=r"unexpected weights.*model\.decoder\.extra\.weight"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "bad")
    DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "bad", strict=False)


def test_automodel_for_causal_lm_gives_our_class(saved_pair):
    model = AutoModelForCausalLM.from_pretrained(saved_pair[0])
    assert type(model) is DiffusionGemmaForBlockDiffusion


def test_generation_config_json_is_read_and_kwargs_override(tmp_path, saved_pair):
    src, builtin, _ = saved_pair
    ours = tiny_model()
    ours.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "generation_config.json").read_text()) if (tmp_path / "generation_config.json").exists() else {}
    cfg.update(max_new_tokens=16, max_denoising_steps=2, t_min=0.1, t_max=0.3,
               sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.5})
    (tmp_path / "generation_config.json").write_text(json.dumps(cfg))
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    assert model.generation_config.max_denoising_steps == 2
    assert model.generation_config.sampler_config.entropy_bound == 0.5
    out = model.generate(torch.randint(3, 128, (1, 4)))
    assert out.sequences.shape == (1, 4 + 16)
    out = model.generate(torch.randint(3, 128, (1, 4)), max_new_tokens=32)
    assert out.sequences.shape == (1, 4 + 32)


def test_bf16_load_rounds_the_embedding_scale(saved_pair):
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(saved_pair[0], dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    emb = model.model.decoder.embed_tokens
    ids = torch.tensor([[5]])
    expected = emb.weight[5] * torch.tensor(64**0.5).to(torch.bfloat16)
    assert torch.equal(emb(ids)[0, 0], expected)
    out = model.generate(torch.randint(3, 128, (1, 4)), max_new_tokens=16, max_denoising_steps=2)
    assert out.sequences.shape == (1, 20)
