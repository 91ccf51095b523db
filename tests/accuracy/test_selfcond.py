"""Exact replay at any top-k (accuracy/selfcond.py): the self-conditioning input's tail comes from our previous step."""

import pytest
import torch
from conftest import tiny_config, tiny_model

from diffusiongemma.accuracy.replay import replay
from diffusiongemma.accuracy.report import summarize
from diffusiongemma.accuracy.selfcond import MATCH_TOLERANCE, mixed_distribution

PROMPTS = torch.randint(4, 100, (2, 20), generator=torch.Generator().manual_seed(1))  # longer than the window (8)
MASK = torch.ones(2, 20, dtype=torch.long)
MASK[1, :6] = 0  # a left-padded row


def test_mixed_distribution_worked_example():
    ours = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()[None, None]  # [1, 1, V = 4]
    probs, tail = mixed_distribution(ours, torch.tensor([[[0]]]), torch.tensor([[[0.5]]]).log())
    torch.testing.assert_close(probs[0, 0], torch.tensor([0.5, 0.25, 0.5 / 3, 0.5 / 6]))
    assert tail.all()
    # our tail is empty (all our mass on the recorded token) while the record's is not: spread evenly
    peaked = torch.tensor([0.0, -1e4, -1e4, -1e4])[None, None]
    probs, tail = mixed_distribution(peaked, torch.tensor([[[0]]]), torch.tensor([[[0.7]]]).log())
    torch.testing.assert_close(probs[0, 0], torch.tensor([0.7, 0.1, 0.1, 0.1]))
    assert not tail.any()


def self_replay(model, top_k: int, steps: int = 4, **generate_kwargs) -> dict:
    torch.manual_seed(0)
    out = model.generate(PROMPTS, attention_mask=MASK, max_new_tokens=32, max_denoising_steps=steps,
                         return_trace=True, trace_top_k=top_k, **generate_kwargs)
    return summarize(replay(model, out.trace), False, 0.99, 0.01), out.trace


def assert_exact(summary: dict) -> None:
    steps = summary["steps"]
    assert summary["passed"]
    assert {s["top1"] for s in steps} == {1.0}
    assert {s["accepted"] for s in steps} == {1.0} and {s["stop"] for s in steps} == {1.0}
    assert max(s["max_dlogprob"] for s in steps) < 1e-5
    later = [s for s in steps if s["step"] > 0]
    assert later and all(s["sc_matched"] == 1.0 for s in later)  # our own input, bit for bit


@pytest.mark.parametrize("layers", [6, 12])
def test_self_replay_at_k8_on_flat_distributions_is_exact(layers, one_thread):
    """A random tiny model is nearly uniform (entropy ~4.8 of ln 128 = 4.85 nats): the recorded top 8 hold ~10 % of
    the self-conditioning mass and our previous step supplies the rest."""
    summary, _ = self_replay(tiny_model(tiny_config(num_hidden_layers=layers)), top_k=8)
    assert_exact(summary)
    later = [s for s in summary["steps"] if s["step"] > 0]
    assert all(s["sc_record"] < 0.2 and s["sc_ours"] > 0.8 and s["sc_spread"] == 0 for s in later)
    first = [s for s in summary["steps"] if s["step"] == 0]
    assert all(s["sc_record"] is None for s in first)  # no self-conditioning at a canvas's first step


def test_self_replay_at_k8_on_a_peaked_model_is_exact(one_thread):
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # sharp logits, as the serving tests' checkpoint
    summary, _ = self_replay(model, top_k=8)
    assert_exact(summary)
    later = [s for s in summary["steps"] if s["step"] > 0]
    assert min(s["sc_record"] for s in later) > 0.9


@pytest.mark.parametrize("switch", ["symmetric-window", "gumbel", "fast"])
@pytest.mark.parametrize("top_k", [8, 128])
def test_each_semantics_switch_replays_exactly_what_it_generates(switch, top_k, one_thread):
    """12 layers, a prompt longer than the window, a padded row; k = V was where the symmetric window used to fail:
    the even k = V rebuild (fp64 from exp(log_softmax)) differed from generate's fp32 softmax @ Emb by rounding, which
    12 random layers grew into flipped near-ties. Now the replay feeds our own input where the record matches it."""
    model = tiny_model(tiny_config(num_hidden_layers=12))
    kwargs = {"gumbel": {"sampling": "gumbel"}, "fast": {"sampling": "fast", "batching": "lockstep", "seed": [3, 4]},
              "symmetric-window": {}}[switch]
    if switch == "symmetric-window":
        model.get_decoder().decoder_window = "symmetric"
    summary, trace = self_replay(model, top_k=top_k, **kwargs)
    assert_exact(summary)
    if switch == "symmetric-window":
        assert trace.manifest["decoder_window"] == "symmetric"
        model.get_decoder().decoder_window = "reference"  # the same trace judged under the reference window fails
        assert not summarize(replay(model, trace), False, 0.99, 0.01)["passed"]


def test_an_engine_that_differs_by_rounding_still_agrees_at_k8(one_thread):
    """Recorded self-conditioning log-probs off by 1e-4 (beyond MATCH_TOLERANCE): no position matches, so every
    input is the record's top 8 plus our rescaled tail, and the replay still passes the default thresholds."""
    assert MATCH_TOLERANCE < 1e-4
    model = tiny_model()
    _, trace = self_replay(model, top_k=8)
    noise = torch.randn(trace.tensors["sc_logprobs"].shape, generator=torch.Generator().manual_seed(0))
    trace.tensors["sc_logprobs"] = trace.tensors["sc_logprobs"] + 1e-4 * noise.sign()
    summary = summarize(replay(model, trace), False, 0.99, 0.01)
    assert summary["passed"]
    later = [s for s in summary["steps"] if s["step"] > 0]
    assert all(s["sc_matched"] == 0.0 for s in later)
    assert max(s["kl"] for s in summary["steps"]) < 1e-5


class NudgeAfterFirstCanvas:
    """A streamer that multiplies one weight by 3 once the first canvas is committed."""

    def __init__(self, weight):
        self.weight, self.puts = weight, 0

    def put(self, value):
        self.puts += 1
        if self.puts == 2:
            self.weight.mul_(3.0)

    def end(self):
        pass


def test_a_perturbed_engine_is_caught_and_localized_at_k8(one_thread):
    model = tiny_model()
    weight = model.get_decoder().layers[2].mlp.down_proj.weight
    original = weight.detach().clone()
    torch.manual_seed(3)
    try:
        out = model.generate(torch.tensor([[10, 20, 30, 40, 50]]), max_new_tokens=48, max_denoising_steps=5,
                             return_trace=True, trace_top_k=8, streamer=NudgeAfterFirstCanvas(weight.detach()))
    finally:
        with torch.no_grad():
            weight.copy_(original)
    summary = summarize(replay(model, out.trace), False, 0.99, 0.01)
    assert not summary["passed"] and summary["first_failing_canvas"] == 1
    canvas0 = [s for s in summary["steps"] if s["canvas"] == 0]
    assert {s["top1"] for s in canvas0} == {1.0} and max(s["max_dlogprob"] for s in canvas0) < 1e-5
    later = [s for s in summary["steps"] if s["canvas"] >= 1 and s["step"] > 0]
    assert all(s["sc_matched"] < 1.0 for s in later)  # the engine's distributions are not ours: mixed inputs


def test_sudoku_model_self_replay_at_k8_is_exact(one_thread):
    from diffusiongemma.sudoku.demo import DEMO_MODEL, load_demo_model
    from diffusiongemma.sudoku.solver import encode_puzzle

    if not (DEMO_MODEL / "model.safetensors").exists():
        pytest.skip("no bundled Sudoku model")
    model, tokenizer = load_demo_model()
    model.eval()
    solution = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
    puzzle = "".join("." if i % 3 == 0 else ch for i, ch in enumerate(solution))
    ids = torch.tensor([encode_puzzle(tokenizer, puzzle)])
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=model.canvas_length, max_denoising_steps=8, return_trace=True,
                         trace_top_k=8)  # k = 8 of V = 15
    summary = summarize(replay(model, out.trace), False, 0.99, 0.01)
    assert_exact(summary)
