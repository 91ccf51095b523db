"""`convert verify` lists every mismatch: a changed value, a missing and an extra tensor, a dtype or shape that
disagrees with the config, a source array that changed after conversion."""

import json

import pytest
import torch
from conftest import tiny_config
from orbax_fixtures import node, source_model, write_checkpoint
from safetensors.torch import load_file, save_file

from diffusiongemma.cli import main
from diffusiongemma.conversion import convert_orbax, verify_conversion
from diffusiongemma.conversion.verify import read_safetensors_header

Q = "model.decoder.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    config = tiny_config()
    model = source_model(config)
    root = tmp_path_factory.mktemp("verify")
    src = write_checkpoint(root / "ckpt", model, config)
    return model, config, src


@pytest.fixture
def converted(setup, tmp_path):
    _, config, src = setup
    dst = tmp_path / "hf"
    convert_orbax(src, dst, config=config, dtype="float32", progress=False)  # one model.safetensors
    return src, dst


def test_a_changed_value_is_reported_with_its_source(converted, capsys):
    src, dst = converted
    file = dst / "model.safetensors"
    header, start = read_safetensors_header(str(file))
    offset = start + header[Q]["data_offsets"][0]
    data = bytearray(file.read_bytes())
    data[offset:offset + 8] = bytes(8)  # two float32 values zeroed
    file.write_bytes(bytes(data))
    assert verify_conversion(src, dst) == [
        f"{Q}: 2 of 4096 values differ from params/transformer/layer_0/attn/q_einsum/w converted to float32"
    ]
    assert main(["convert", "verify", str(src), str(dst), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "(1 problem(s)):" in err and Q in err


def test_missing_extra_and_misshaped_tensors(converted):
    src, dst = converted
    tensors = load_file(str(dst / "model.safetensors"))
    del tensors["model.decoder.norm.weight"]
    tensors["model.decoder.bogus"] = torch.zeros(2)
    tensors["model.decoder.layers.0.router.scale"] = tensors["model.decoder.layers.0.router.scale"].double()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    assert verify_conversion(src, dst) == [
        "missing tensor model.decoder.norm.weight",
        "unexpected tensor model.decoder.bogus (no rule writes it)",
        "model.decoder.layers.0.router.scale: config says float32 (64,), file holds F64 (64,)",
    ]


def test_a_config_that_disagrees_with_the_checkpoint(converted):
    src, dst = converted
    config = json.loads((dst / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 80
    (dst / "config.json").write_text(json.dumps(config))
    problems = verify_conversion(src, dst)
    assert "params/transformer/layer_0/mlp2/linear/w: expected shape (80, 64) (from the config), found (96, 64)" \
        in problems
    assert "model.decoder.layers.0.mlp.down_proj.weight: config says float32 (64, 80), file holds F32 (64, 96)" \
        in problems


def test_a_source_changed_after_conversion(setup, converted, tmp_path):
    model, config, _ = setup
    _, dst = converted

    def edit(tree):
        parent, leaf = node(tree, "transformer/vision_encoder/transformer/stacked_layers/block/mlp/linear/w")
        parent[leaf] = parent[leaf] * 2  # one stacked vision layer here: the whole stack changes

    other = write_checkpoint(tmp_path / "other", model, config, edit=edit)
    assert verify_conversion(other, dst) == [
        "model.encoder.vision_tower.encoder.layers.0.mlp.down_proj.linear.weight: 2048 of 2048 values differ from "
        "params/transformer/vision_encoder/transformer/stacked_layers/block/mlp/linear/w[0] converted to float32"
    ]
