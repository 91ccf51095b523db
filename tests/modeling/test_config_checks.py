"""modeling/config.py `check_config` and `check_model_folder`, loader.py `check_weight_files`: a bad config is refused
when the model is built and when a folder is loaded, naming the field, its value and what is allowed; a folder of
another model, without config.json, or with competing weight sets is refused by name."""

import json
import shutil

import pytest
import torch
from transformers import LlamaConfig

from conftest import tiny_config, tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion as Model

BAD = [
    (dict(sliding_window=0), "`text_config.sliding_window` = 0"),
    (dict(sliding_window=-4), "`text_config.sliding_window` = -4"),
    (dict(canvas_length=0), "`canvas_length` = 0"),
    (dict(canvas_length=-16), "`canvas_length` = -16"),
    (dict(canvas_length=2000), r"`canvas_length` = 2000, expected at most max_position_embeddings"),
    (dict(top_k_experts=5), r"`text_config.top_k_experts` = 5, expected at most num_experts \(4\)"),
    (dict(top_k_experts=0), "`text_config.top_k_experts` = 0"),
    (dict(num_experts=-1), "`text_config.num_experts` = -1"),
    (dict(hidden_size=-64), "`text_config.hidden_size` = -64"),
    (dict(vocab_size=0), "`text_config.vocab_size` = 0"),
    (dict(intermediate_size=0), "`text_config.intermediate_size` = 0"),
    (dict(moe_intermediate_size=-32), "`text_config.moe_intermediate_size` = -32"),
    (dict(num_attention_heads=0), "`text_config.num_attention_heads` = 0"),
    (dict(num_key_value_heads=3), r"`text_config.num_key_value_heads of layer 0` = 3, expected a positive divisor"),
    (dict(num_global_key_value_heads=3), "`text_config.num_key_value_heads of layer 5` = 3"),
    (dict(head_dim=0), "`text_config.head_dim of layer 0` = 0"),
    (dict(head_dim=15), "`text_config.head_dim of layer 0` = 15"),
    (dict(global_head_dim=-32), "`text_config.head_dim of layer 5` = -32"),
    (dict(rms_norm_eps=-1e-6), "`text_config.rms_norm_eps` = -1e-06"),
    (dict(rms_norm_eps=0.0), "`text_config.rms_norm_eps` = 0.0"),
    (dict(rms_norm_eps=float("nan")), "`text_config.rms_norm_eps` = nan"),
    (dict(final_logit_softcapping=0.0), r"`text_config.final_logit_softcapping` = 0.0, expected None \(no cap\)"),
    (dict(final_logit_softcapping=-30.0), "`text_config.final_logit_softcapping` = -30.0"),
    (dict(final_logit_softcapping=float("inf")), "`text_config.final_logit_softcapping` = inf"),
    (dict(pad_token_id=500), r"`text_config.pad_token_id` = 500, expected None or an id in \[0, vocab_size=128\)"),
    (dict(max_position_embeddings=0), "`text_config.max_position_embeddings` = 0"),
    (dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": -1.0},
                           "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
     r"rope_parameters\['sliding_attention'\].rope_theta` = -1.0"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[m.split("`")[1] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_config_refused_on_construction(overrides, message):
    with pytest.raises(ValueError, match=message):
        Model(tiny_config(**overrides))


def test_unknown_layer_type_refused():
    config = tiny_config()
    config.text_config.layer_types[1] = "chunked_attention"  # transformers accepts it; our attention cannot run it
    with pytest.raises(ValueError, match=r"`text_config.layer_types\[1\]` = 'chunked_attention'"):
        Model(config)
    config.text_config.layer_types = config.text_config.layer_types[:3]
    with pytest.raises(ValueError, match=r"`text_config.layer_types` = .* expected a list of num_hidden_layers \(6\)"):
        Model(config)


def test_another_config_class_refused():
    with pytest.raises(TypeError, match="needs a DiffusionGemmaConfig, got LlamaConfig"):
        Model(LlamaConfig())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    tiny_model().save_pretrained(path)
    return path


def copy_of(folder, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    return target


def edit_json(path, **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_bad_config_refused_on_load(folder, tmp_path):
    path = copy_of(folder, tmp_path)
    data = json.loads((path / "config.json").read_text())
    data["text_config"]["sliding_window"] = 0
    (path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="`text_config.sliding_window` = 0"):
        Model.from_pretrained(path)


@pytest.mark.parametrize("model_type", ["llama", "gemma3", "gemma4", "diffusion_gemma_text"])
def test_folder_of_another_model(folder, tmp_path, model_type):
    path = copy_of(folder, tmp_path)
    edit_json(path / "config.json", model_type=model_type)
    with pytest.raises(ValueError, match=f"holds a {model_type} checkpoint, not DiffusionGemma"):
        Model.from_pretrained(path)


def test_missing_or_broken_config(folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Model.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Model.from_pretrained("./no/such/model")
    path = copy_of(folder, tmp_path)
    with pytest.raises(FileNotFoundError, match="is a file, not a model folder"):
        Model.from_pretrained(path / "config.json")
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        Model.from_pretrained(path)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        Model.from_pretrained(path)
    edit = (path / "config.json")
    edit.write_text(json.dumps({"architectures": ["X"]}))
    with pytest.raises(ValueError, match=r"holds a unknown \(no model_type\) checkpoint"):
        Model.from_pretrained(path)


@pytest.mark.parametrize("text", ["{broken", "[1, 2]", '{"t_max": "hot"}', '{"max_denoising_steps": 0}'])
def test_corrupt_generation_config_is_an_error(folder, tmp_path, text):
    path = copy_of(folder, tmp_path)
    (path / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match="generation_config.json|`t_max`|`max_denoising_steps`"):
        Model.from_pretrained(path)


def test_missing_generation_config_keeps_defaults(folder, tmp_path):
    path = copy_of(folder, tmp_path)
    (path / "generation_config.json").unlink(missing_ok=True)
    assert Model.from_pretrained(path).generation_config.max_denoising_steps is None


def test_competing_weight_sets_refused(folder, tmp_path):
    path = copy_of(folder, tmp_path)
    sharded = tmp_path / "sharded"
    Model.from_pretrained(path).save_pretrained(sharded, max_shard_size="100KB")
    for f in sharded.glob("model*"):
        shutil.copy(f, path / f.name)
    with pytest.raises(ValueError, match="two competing weight sets"):
        Model.from_pretrained(path)
    (path / "model.safetensors").unlink()
    assert torch.equal(Model.from_pretrained(path).lm_head.weight, Model.from_pretrained(sharded).lm_head.weight)
    shards = sorted(path.glob("model-*.safetensors"))
    shutil.copy(shards[0], path / "model-00099-of-00099.safetensors")
    with pytest.raises(ValueError, match=r"shard files its index does not list.*model-00099-of-00099"):
        Model.from_pretrained(path)
    (path / "model-00099-of-00099.safetensors").unlink()
    shards[-1].unlink()
    with pytest.raises(FileNotFoundError, match=f"index lists shards that are missing.*{shards[-1].name}"):
        Model.from_pretrained(path)
