"""`from_pretrained(distributed_config=...)` refuses what the parallel plans cannot shard, before any process group
exists (so these run in one process), and maps the expert-parallel-only request onto a plan transformers accepts."""

import json

import pytest
from transformers import DistributedConfig

from conftest import tiny_config, tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.modeling.parallel import stack_plans
from diffusiongemma.modeling.parallel_request import expert_parallel_only, prepare_parallel_load


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The usual tiny model: 4 heads, 2 KV heads on sliding layers but 1 on the full layer (5), 4 experts."""
    path = tmp_path_factory.mktemp("tiny")
    tiny_model().save_pretrained(path)
    return path


def test_a_world_size_that_does_not_divide_the_kv_heads_names_the_layer_and_suggests_ep(folder):
    with pytest.raises(ValueError) as error:
        DiffusionGemmaForBlockDiffusion.from_pretrained(folder, distributed_config=DistributedConfig(tp_size=2))
    message = str(error.value)
    assert "num_key_value_heads of layer 5 (full_attention) = 1 is not divisible by tp_size = 2" in message
    assert "layer 0" not in message  # sliding layers have 2 KV heads: fine
    assert "DistributedConfig(ep_size=WORLD_SIZE, tp_plan={})" in message


def test_a_world_size_that_does_not_divide_heads_or_experts_names_both(folder):
    with pytest.raises(ValueError) as error:
        DiffusionGemmaForBlockDiffusion.from_pretrained(
            folder, distributed_config=DistributedConfig(tp_size=3, ep_size=3))
    message = str(error.value)
    assert "num_attention_heads = 4 is not divisible by tp_size = 3" in message
    assert "num_experts = 4 is not divisible by ep_size = 3" in message


def test_expert_parallelism_alone_checks_only_the_experts(folder):
    with pytest.raises(ValueError) as error:
        DiffusionGemmaForBlockDiffusion.from_pretrained(
            folder, distributed_config=DistributedConfig(tp_size=3, ep_size=3, tp_plan={}))
    assert "num_experts = 4 is not divisible by ep_size = 3" in str(error.value)
    assert "num_attention_heads" not in str(error.value)  # attention is not split under expert parallelism alone


def test_device_map_with_tensor_parallelism_is_refused(folder):
    with pytest.raises(ValueError, match=r"device_map='cpu' cannot be combined with tensor or expert parallelism"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(
            folder, device_map="cpu", distributed_config=DistributedConfig(tp_size=2))


def test_a_quantized_checkpoint_with_a_plan_is_refused(tmp_path):
    tiny_model(tiny_config(num_global_key_value_heads=2)).save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized"}
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="a quantized checkpoint or quantization_config cannot be loaded with tensor"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, distributed_config=DistributedConfig(tp_size=2))


def test_no_request_or_a_single_rank_leaves_the_arguments_alone(folder):
    kwargs = {"dtype": "float32"}
    assert prepare_parallel_load(DiffusionGemmaForBlockDiffusion, folder, kwargs) is kwargs
    single = {"distributed_config": DistributedConfig(tp_size=1)}
    assert prepare_parallel_load(DiffusionGemmaForBlockDiffusion, folder, single) is single


def test_expert_parallelism_alone_replicates_every_tp_rule():
    tp_plan, _ = stack_plans(tiny_config().text_config)
    mapped = expert_parallel_only(DistributedConfig(tp_size=2, ep_size=2, tp_plan={}), tp_plan)
    assert mapped.tp_plan == dict.fromkeys(tp_plan, "replicate") and mapped.ep_size == 2 and mapped.tp_size == 2
    both = DistributedConfig(tp_size=2, ep_size=2)  # TP attention + EP experts: kept as asked
    assert expert_parallel_only(both, tp_plan) is both
