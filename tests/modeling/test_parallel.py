"""The parallel plans name our modules: every rule of the text config's plans, moved under `model.decoder.`, matches
a module or parameter of the model, so transformers' engine shards what the plan says (and warns about nothing).
The experts take transformers' expert-parallel local ids, where an id past the rank's experts means "elsewhere"."""

import re

import pytest
import torch

from conftest import tiny_config, tiny_model
from diffusiongemma.modeling.moe import Experts
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


@pytest.mark.parametrize("hidden", [64, 6], ids=["grouped_mm", "per_expert"])  # 6 fp32 = 24 B rows: no grouped_mm
def test_experts_add_nothing_for_routes_to_another_ranks_experts(hidden):
    """Under expert parallelism this rank holds experts [0, 2) of 4; transformers' all-reduce dispatch hands it local
    ids, with id 2 (= its expert count) and weight 0 for a route to another rank. The result must equal the same
    experts run on the on-rank routes alone."""
    torch.manual_seed(0)
    experts = Experts(2, hidden, 8)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.3)
    torch.nn.init.normal_(experts.down_proj, std=0.3)
    experts._is_expert_parallel = True  # what transformers' "grouped_gemm" sharding sets
    x = torch.randn(5, hidden)
    top_i = torch.tensor([[0, 2], [2, 1], [1, 0], [2, 2], [0, 1]])
    top_w = torch.rand(5, 2).masked_fill(top_i == 2, 0.0)
    got = experts(x, top_i, top_w)
    want = torch.zeros_like(x)
    for t in range(5):
        for slot in range(2):
            e = int(top_i[t, slot])
            if e < 2:
                gate, up = (experts.gate_up_proj[e] @ x[t]).chunk(2)
                hidden_e = torch.nn.functional.gelu(gate, approximate="tanh") * up
                want[t] += top_w[t, slot] * (experts.down_proj[e] @ hidden_e)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[3], torch.zeros(hidden))  # both routes elsewhere: nothing
