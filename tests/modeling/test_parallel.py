"""The parallel plans name our modules: every rule of the text config's plans, moved under `model.decoder.`, matches
a module or parameter of the model, so transformers' engine shards what the plan says (and warns about nothing)."""

import re

import torch

from conftest import tiny_config, tiny_model
from diffusiongemma.modeling.parallel import HEAD_PLAN, is_dtensor, stack_plans


def wildcard(name: str) -> str:
    return re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name)  # transformers' layer-number wildcard


def test_every_rule_of_both_plans_matches_a_module_or_parameter():
    model = tiny_model()
    names = {wildcard(n) for n, _ in model.named_modules()} | {wildcard(n) for n, _ in model.named_parameters()}
    tp, ep = stack_plans(model.config.text_config)
    assert set(tp) - names == set() and set(ep) - names == set()
    # the engine builds the same plans on the model itself (init_parallel_plans, in post_init)
    assert model.tp_plan == tp and model.ep_plan == ep


def test_plans_follow_the_text_config_with_our_prefix_and_the_head_rules():
    text = tiny_config().text_config
    tp, ep = stack_plans(text)
    assert tp["model.decoder.layers.*.self_attn.q_proj"] == text.base_model_tp_plan["layers.*.self_attn.q_proj"]
    assert tp["model.decoder.layers.*.experts"] == "moe_tp_experts"
    assert ep["model.decoder.layers.*.experts"] == "ep_dispatch_experts"
    assert tp["lm_head"] == "colwise_gather_output"  # every rank sees all V logits
    assert tp["model.decoder.embed_tokens"] == "embedding_rowwise"  # tied to lm_head: same vocabulary slices
    assert not set(HEAD_PLAN) & set(ep)  # expert parallelism keeps the head and the embedding whole


def test_plain_tensors_are_not_dtensors():
    assert not is_dtensor(torch.ones(2))
