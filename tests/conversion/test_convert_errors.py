"""Clear errors from `convert orbax`: a missing array, a mis-shaped one, a config that does not fit, arrays no rule
converts, an existing DST, an interrupted conversion, TensorStore not installed."""

import sys

import numpy as np
import pytest
from conftest import tiny_config
from orbax_fixtures import node, source_model, write_checkpoint

from diffusiongemma.cli import main
from diffusiongemma.conversion import ConversionError, convert_orbax
from diffusiongemma.conversion import convert as convert_module


@pytest.fixture(scope="module")
def model_and_config():
    config = tiny_config()
    return source_model(config), config


def checkpoint(tmp_path, model_and_config, edit=None):
    model, config = model_and_config
    return write_checkpoint(tmp_path / "ckpt", model, config, edit=edit)


def drop(path):
    def edit(tree):
        parent, leaf = node(tree, path)
        del parent[leaf]
    return edit


def test_missing_array_names_the_orbax_path(tmp_path, model_and_config, capsys):
    src = checkpoint(tmp_path, model_and_config, drop("transformer/layer_1/attn/q_einsum/w"))
    with pytest.raises(ConversionError) as error:
        convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    assert error.value.problems == [
        "missing array: params/transformer/layer_1/attn/q_einsum/w (needed for "
        "model.decoder.layers.1.self_attn.q_proj.weight, shape (4, 64, 16))"
    ]
    model_and_config[1].save_pretrained(tmp_path / "cfg")
    assert main(["convert", "orbax", str(src), str(tmp_path / "hf"), "--config", str(tmp_path / "cfg"),
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "missing array: params/transformer/layer_1/attn/q_einsum/w" in err
    assert not (tmp_path / "hf").exists()


def test_misshaped_array_names_path_expected_and_found(tmp_path, model_and_config):
    def edit(tree):
        parent, leaf = node(tree, "transformer/layer_5/attn/k_einsum/w")  # the full layer: K=1, D=32
        parent[leaf] = np.zeros((1, 64, 16), np.float32)

    src = checkpoint(tmp_path, model_and_config, edit)
    with pytest.raises(ConversionError) as error:
        convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    assert error.value.problems == [
        "params/transformer/layer_5/attn/k_einsum/w: expected shape (1, 64, 32) (from the config), found (1, 64, 16)"
    ]


def test_config_that_does_not_fit(tmp_path, model_and_config):
    src = checkpoint(tmp_path, model_and_config)
    wrong = tiny_config(num_hidden_layers=12, hidden_size=48)
    with pytest.raises(ConversionError) as error:
        convert_orbax(src, tmp_path / "hf", config=wrong, progress=False)
    problems = error.value.problems
    assert problems[0] == ("the checkpoint has 6 text layers (transformer/layer_0 .. layer_5), the config says "
                           "text_config.num_hidden_layers = 12")
    assert "params/transformer/embedder/input_embedding: expected shape (128, 48) (from the config), found " \
           "(128, 64)" in problems
    assert any(p.startswith("missing array: params/transformer/layer_11/") for p in problems)
    assert "does not fit the config" in str(error.value)


def test_unused_arrays_are_an_error_unless_allowed(tmp_path, model_and_config):
    def edit(tree):
        tree["transformer"]["extra_head"] = {"w": np.ones((3, 4), np.float32)}

    src = checkpoint(tmp_path, model_and_config, edit)
    with pytest.raises(ConversionError, match=r"1 array\(s\) that no rule converts .*params/transformer/extra_head/w"):
        convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False, allow_unused=True)


def test_existing_destination_is_refused_unless_overwrite(tmp_path, model_and_config):
    src = checkpoint(tmp_path, model_and_config)
    dst = tmp_path / "hf"
    convert_orbax(src, dst, config=model_and_config[1], dtype="float32", progress=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert_orbax(src, dst, config=model_and_config[1], progress=False)
    convert_orbax(src, dst, config=model_and_config[1], dtype="bfloat16", progress=False, overwrite=True)
    assert '"dtype": "bfloat16"' in (dst / "config.json").read_text()


def test_interrupted_conversion_leaves_no_folder(tmp_path, model_and_config, monkeypatch):
    src = checkpoint(tmp_path, model_and_config)
    real = convert_module.streamed_chunks
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(convert_module, "streamed_chunks", failing)
    with pytest.raises(KeyboardInterrupt):
        convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no DST, no temporary sibling


def test_without_tensorstore_the_error_says_what_to_install(tmp_path, model_and_config, monkeypatch):
    src = checkpoint(tmp_path, model_and_config)
    monkeypatch.setitem(sys.modules, "tensorstore", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r'pip install "diffusiongemma\[convert\]"'):
        convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)


def test_source_that_is_not_an_orbax_checkpoint(tmp_path, model_and_config):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no _METADATA"):
        convert_orbax(tmp_path / "empty", tmp_path / "hf", config=model_and_config[1], progress=False)
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        convert_orbax(tmp_path / "empty", tmp_path / "hf", tokenizer=tmp_path / "no_such_folder", progress=False)
    bad_shard = ["convert", "orbax", str(tmp_path / "empty"), str(tmp_path / "hf"), "--max-shard-size", "lots"]
    with pytest.raises(SystemExit):
        main(bad_shard)
