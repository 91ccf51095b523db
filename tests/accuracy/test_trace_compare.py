"""Teacher-forced comparison (accuracy/replay.py, accuracy/report.py) and the `trace` / `compare` commands."""

import json

import pytest
import torch

from diffusiongemma.accuracy import load_trace
from diffusiongemma.accuracy.replay import coarse_kl, replay, soft_from_top_k
from diffusiongemma.accuracy.report import summarize
from diffusiongemma.cli import main

V = 128


def test_coarse_kl_worked_example():
    # recorded p = (0.5, 0.5) on 2 of V tokens, ours q = (0.25, 0.25) + rest 0.5 -> KL = ln 2
    rec = torch.tensor([0.5, 0.5]).log()
    ours = torch.tensor([0.25, 0.25]).log()
    assert coarse_kl(rec, ours, V).item() == pytest.approx(0.6931, abs=1e-4)
    assert coarse_kl(rec, rec, V).item() == pytest.approx(0.0, abs=1e-9)


def test_soft_from_full_top_k_is_the_soft_embedding(saved_pair):
    _, _, model = saved_pair
    stack = model.get_decoder()
    logits = torch.randn(1, 16, V, generator=torch.Generator().manual_seed(0))
    lp, ids = torch.log_softmax(logits, -1).topk(V, dim=-1)
    soft = soft_from_top_k(stack, ids.int(), lp, torch.ones(1, dtype=torch.bool))
    torch.testing.assert_close(soft, stack.embed_tokens.soft(logits.softmax(-1)), rtol=1e-5, atol=1e-5)
    assert not soft_from_top_k(stack, ids.int(), lp, torch.zeros(1, dtype=torch.bool)).any()


def trace_cli(path, out, *extra):
    return main(["trace", "--model", str(path), "--prompts", str(out.parent / "prompts.txt"), "--out", str(out),
                 "--max-new-tokens", "48", "--steps", "4", "--seed", "5", *extra])


@pytest.fixture
def prompts(tmp_path):
    (tmp_path / "prompts.txt").write_text("Hello there\nA longer prompt, padded\n")
    return tmp_path / "prompts.txt"


def test_replaying_our_own_trace_agrees_fully_and_exits_0(saved_pair, tmp_path, prompts, capsys, one_thread):
    path = saved_pair[0]
    assert trace_cli(path, tmp_path / "t", "--top-k", str(V)) == 0  # k = V: the exact self-conditioning state
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["prompts"] == ["Hello there", "A longer prompt, padded"]
    assert manifest["batch_size"] == 2 and manifest["seed"] == 5
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["passed"] and summary["mode"] == "full"
    assert {s["top1"] for s in summary["steps"]} == {1.0}
    assert {s["accepted"] for s in summary["steps"]} == {1.0} and {s["stop"] for s in summary["steps"]} == {1.0}
    assert max(s["kl"] for s in summary["steps"]) < 1e-5
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t")]) == 0
    table = capsys.readouterr().out
    assert "worst step: canvas" in table and "PASS" in table


class NudgeAfterFirstCanvas:
    """A streamer that multiplies one weight by 3 once the first canvas is committed: an engine that is right on
    canvas 0 and wrong from canvas 1 on."""

    def __init__(self, weight):
        self.weight, self.puts = weight, 0

    def put(self, value):
        self.puts += 1
        if self.puts == 2:  # the prompt, then canvas 0
            self.weight.mul_(3.0)

    def end(self):
        pass


def test_a_perturbed_engine_is_caught_at_the_right_canvas(saved_pair, tmp_path, one_thread):
    _, _, model = saved_pair
    weight = model.get_decoder().layers[2].mlp.down_proj.weight
    original = weight.detach().clone()
    torch.manual_seed(3)
    try:
        out = model.generate(torch.tensor([[10, 20, 30, 40, 50]]), max_new_tokens=48, max_denoising_steps=5,
                             return_trace=True, trace_top_k=V, streamer=NudgeAfterFirstCanvas(weight.detach()))
    finally:
        with torch.no_grad():
            weight.copy_(original)
    out.trace.save(tmp_path / "bad")
    summary = summarize(replay(model, load_trace(tmp_path / "bad")), False, 0.99, 0.01)
    assert not summary["passed"] and summary["first_failing_canvas"] == 1
    assert summary["worst_step"]["canvas"] >= 1
    canvas0 = [s for s in summary["steps"] if s["canvas"] == 0]
    assert {s["top1"] for s in canvas0} == {1.0} and max(s["max_dlogprob"] for s in canvas0) < 1e-4
    assert main(["compare", "--model", str(saved_pair[0]), "--trace", str(tmp_path / "bad")]) == 1


def test_a_malformed_trace_exits_2_and_says_what(saved_pair, tmp_path, prompts, capsys, one_thread):
    path = saved_pair[0]
    assert trace_cli(path, tmp_path / "t") == 0
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "t" / "trace.safetensors"))
    tensors["entropy"] = tensors["entropy"].double()
    save_file(tensors, str(tmp_path / "t" / "trace.safetensors"))
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t")]) == 2
    assert "does not match its manifest (`tensors_sha256`)" in capsys.readouterr().err  # edited after the write
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    del manifest["tensors_sha256"]  # as another engine writes it: no checksum
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(manifest))
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t")]) == 2
    assert "`entropy` must be torch.float32" in capsys.readouterr().err
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "nothing")]) == 2
    assert "manifest.json is missing" in capsys.readouterr().err


def test_a_minimal_trace_scores_committed_canvases(saved_pair, tmp_path, prompts, capsys, one_thread):
    path = saved_pair[0]
    assert trace_cli(path, tmp_path / "t") == 0
    full = load_trace(tmp_path / "t")
    minimal = type(full)({k: full.manifest[k] for k in ("format", "version", "prompt_length", "canvas_length")},
                         {"sequences": full.tensors["sequences"], "attention_mask": full.tensors["attention_mask"]})
    minimal.save(tmp_path / "m")
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "m"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert summary["mode"] == "minimal" and len(summary["steps"]) == 3
    assert summary["steps"][0]["kl"] is None  # not measured on a minimal trace
    assert all(0 <= s["top1"] <= 1 and s["mean_entropy"] > 0 for s in summary["steps"])
    # an explicit threshold the random tiny model cannot meet fails the run
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "m"), "--min-top1", "1"]) == 1


def test_a_small_k_replay_is_exact_with_and_without_the_recorded_input(saved_pair, tmp_path, prompts, capsys,
                                                                         one_thread):
    """k = 8 of V = 128 on a nearly uniform model: the record holds ~10 % of the self-conditioning mass and our
    previous step the rest (exact for our own trace); with --sc-embedding the record holds all of it."""
    path = saved_pair[0]
    assert trace_cli(path, tmp_path / "approx") == 0
    assert trace_cli(path, tmp_path / "exact", "--sc-embedding") == 0
    exact = load_trace(tmp_path / "exact")
    assert exact.manifest["sc_embedding"] and exact.tensors["sc_embedding"].shape[-1] == 64
    capsys.readouterr()
    for name, record_share in (("approx", (0.0, 0.2)), ("exact", (1.0, 1.0))):
        assert main(["compare", "--model", str(path), "--trace", str(tmp_path / name), "--json"]) == 0
        steps = json.loads(capsys.readouterr().out)["steps"]
        assert {s["top1"] for s in steps} == {1.0} and max(s["max_dlogprob"] for s in steps) < 1e-5
        shares = [s["sc_record"] for s in steps if s["step"] > 0]
        assert all(record_share[0] <= x <= record_share[1] for x in shares), (name, shares)
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "approx")]) == 0
    assert "sc-rec" in capsys.readouterr().out
