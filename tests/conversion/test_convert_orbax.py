"""`convert_orbax` on checkpoints written by orbax-checkpoint: exact tensors, loadable by our class and transformers'
built-in class with identical logits, the layout transformers writes, `verify` passing, the CLI."""

import json

import pytest
import torch
from conftest import tiny_builtin, tiny_config, tiny_tokenizer
from orbax_fixtures import bf16, source_model, write_checkpoint
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers import DiffusionGemmaForBlockDiffusion as BuiltinModel

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.cli import main
from diffusiongemma.conversion import RELEASED_GENERATION_CONFIG, convert_orbax, verify_conversion
from diffusiongemma.generation.config import DiffusionGemmaGenerationConfig


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(config, source model, Orbax checkpoint folder) with a vision tower, arrays stored in float32."""
    config = tiny_config()
    model = source_model(config)
    path = write_checkpoint(tmp_path_factory.mktemp("orbax") / "ckpt", model, config)
    return config, model, path


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
    config, _, path = source
    dst = tmp_path_factory.mktemp("hf") / "converted"
    info = convert_orbax(path, dst, config=config, dtype="float32", max_shard_size="300KB", progress=False)
    return dst, info


def saved_keys(folder) -> dict:
    with open(folder / "model.safetensors.index.json") as f:
        return json.load(f)


def test_every_tensor_equals_the_source_model(source, converted):
    _, model, _ = source
    dst, info = converted
    loaded = DiffusionGemmaForBlockDiffusion.from_pretrained(dst)  # strict: no missing, unexpected or mis-shaped
    expected, got = model.state_dict(), loaded.state_dict()
    assert set(got) == set(expected)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []
    assert info["tensors"] == len(expected) - 1  # all but the tied lm_head
    assert info["shards"] > 1


def test_layout_is_what_the_builtin_class_writes(source, converted, tmp_path):
    config, model, _ = source
    dst, _ = converted
    builtin = tiny_builtin(config)
    builtin.load_state_dict(model.state_dict(), strict=False)
    builtin.save_pretrained(tmp_path / "first")
    # loaded with an explicit dtype, as the upstream converter does: the sub-configs then carry it too (spec A.4)
    builtin = BuiltinModel.from_pretrained(tmp_path / "first", dtype=torch.float32)
    builtin.save_pretrained(tmp_path, max_shard_size="300KB")
    ours, theirs = saved_keys(dst), saved_keys(tmp_path)
    assert set(ours["weight_map"]) == set(theirs["weight_map"])
    assert ours["metadata"] == theirs["metadata"]  # total_size and total_parameters
    with open(dst / "config.json") as f, open(tmp_path / "config.json") as g:
        assert json.load(f) == json.load(g)
    shard = dst / sorted(set(ours["weight_map"].values()))[0]
    with safe_open(str(shard), "pt") as f:
        assert f.metadata() == {"format": "pt"}


@torch.no_grad()
def test_builtin_and_ours_give_the_same_logits_on_the_converted_folder(source, converted):
    _, model, _ = source
    dst, _ = converted
    builtin, info = BuiltinModel.from_pretrained(dst, output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(dst)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (2, 12), generator=g)  # 12 > sliding window 8
    canvas = torch.randint(0, 128, (2, 16), generator=g)
    want = model(input_ids=ids, decoder_input_ids=canvas).logits
    got_ours = ours.eval()(input_ids=ids, decoder_input_ids=canvas).logits
    got_builtin = builtin.eval()(input_ids=ids, decoder_input_ids=canvas).logits
    assert (got_ours - want).abs().max().item() <= 1e-5
    assert (got_builtin - got_ours).abs().max().item() <= 1e-4  # the parity tests' tolerance


def test_verify_passes(source, converted):
    _, _, path = source
    dst, _ = converted
    assert verify_conversion(path, dst) == []


def test_bfloat16_source_to_bfloat16_with_generation_config(source, tmp_path):
    config, model, _ = source
    path = write_checkpoint(tmp_path / "ckpt", model, config, dtype="bfloat16")
    dst = tmp_path / "hf"
    convert_orbax(path, dst, config=config, progress=False)  # dtype bfloat16 by default
    with safe_open(str(dst / "model.safetensors"), "pt") as f:
        for key in f.keys():
            want = bf16(model.state_dict()[key].numpy())  # float32 -> bf16 when written, stays bf16 after
            assert torch.equal(f.get_tensor(key), want), key
    with open(dst / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"
    generation = DiffusionGemmaGenerationConfig.from_pretrained(dst)
    for name, value in RELEASED_GENERATION_CONFIG.items():
        assert getattr(generation, name) == value, name
    assert generation.sampler_config.entropy_bound == 0.1
    assert verify_conversion(path, dst) == []


def test_text_only_drops_the_vision_tower(source, tmp_path):
    config, model, path = source
    dst = tmp_path / "hf"
    convert_orbax(path, dst, config=config, dtype="float32", text_only=True, progress=False)
    with open(dst / "config.json") as f:
        assert json.load(f)["vision_config"] is None
    expected = {k: v for k, v in model.state_dict().items()
                if k != "lm_head.weight" and "vision_tower" not in k and "embed_vision" not in k}
    with safe_open(str(dst / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(expected)
        assert all(torch.equal(f.get_tensor(k), v) for k, v in expected.items())
    assert verify_conversion(path, dst) == []


def test_text_only_folder_loads_strictly_without_a_vision_tower(source, tmp_path):
    config, model, path = source
    dst = tmp_path / "hf"
    convert_orbax(path, dst, config=config, dtype="float32", text_only=True, progress=False)
    loaded = DiffusionGemmaForBlockDiffusion.from_pretrained(dst)  # strict: nothing missing, nothing random
    assert loaded.config.vision_config is None
    assert loaded.model.encoder.vision_tower is None and loaded.model.encoder.embed_vision is None
    ids = torch.randint(3, config.text_config.vocab_size, (1, 7))
    canvas = torch.randint(3, config.text_config.vocab_size, (1, loaded.canvas_length))
    with torch.no_grad():
        got = loaded(input_ids=ids, decoder_input_ids=canvas).logits
        want = model.eval()(input_ids=ids, decoder_input_ids=canvas).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    pixels, positions = torch.zeros(1, 4, 3 * 16 * 16), torch.zeros(1, 4, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="text-only .*vision_config: null"):
        loaded(input_ids=ids, decoder_input_ids=canvas, pixel_values=pixels, image_position_ids=positions)
    loaded.save_pretrained(tmp_path / "again")  # stays text-only through a save
    with open(tmp_path / "again" / "config.json") as f:
        assert json.load(f)["vision_config"] is None
    assert DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "again").model.encoder.vision_tower is None


def test_text_only_source_without_vision_arrays(source, tmp_path):
    config, model, _ = source
    path = write_checkpoint(tmp_path / "ckpt", model, config, text_only=True)
    convert_orbax(path, tmp_path / "hf", config=config, text_only=True, progress=False)
    assert verify_conversion(path, tmp_path / "hf") == []


def test_cli_convert_then_verify_then_auto_class(source, tmp_path, capsys):
    config, model, path = source
    config.save_pretrained(tmp_path / "cfg")
    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    dst = tmp_path / "hf"
    assert main(["convert", "orbax", str(path), str(dst), "--config", str(tmp_path / "cfg" / "config.json"),
                 "--dtype", "float32", "--tokenizer", str(tmp_path / "tok"), "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().err
    assert (dst / "tokenizer.json").is_file()
    assert main(["convert", "verify", str(path), str(dst), "--quiet"]) == 0
    assert "every tensor exact" in capsys.readouterr().err
    loaded = AutoModelForCausalLM.from_pretrained(dst)
    assert isinstance(loaded, DiffusionGemmaForBlockDiffusion)
    assert torch.equal(loaded.state_dict()["model.decoder.embed_tokens.weight"],
                       model.state_dict()["model.decoder.embed_tokens.weight"])
