"""The `acceptance` check by each sampler's own rule (accuracy/acceptance.py): our traces record every position's
draw and its tempered log-probability (`draw_ids`, `draw_logprobs`); with them a clean run of confidence threshold,
block refinement and discrete DDIM passes, and a sampler with a wrong acceptance rule planted fails `acceptance`.
Without the draws the check is partial and says so (issue 37). Tiny random model, fp32, a few steps."""

import json

import pytest
import torch

from diffusiongemma import BlockRefinementSamplerConfig, ConfidenceThresholdSamplerConfig, DiscreteDDIMSamplerConfig
from diffusiongemma.accuracy import load_trace
from diffusiongemma.accuracy.checks import Tolerances, recorded_sampler_config, run_checks
from diffusiongemma.accuracy.format import TraceFormatError, validate
from diffusiongemma.cli import main
from diffusiongemma.generation import block_refinement, confidence_threshold, discrete_ddim

CONFIGS = {
    "confidence_threshold": ConfidenceThresholdSamplerConfig(threshold=0.02),
    "confidence_factor": ConfidenceThresholdSamplerConfig(factor=0.995),
    "block_refinement": BlockRefinementSamplerConfig(threshold=0.02),
    "discrete_ddim": DiscreteDDIMSamplerConfig(),
    "discrete_ddim_corrector": DiscreteDDIMSamplerConfig(corrector_steps=1, corrector_k=3),
}


def run(model, config, steps: int = 6):
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids, sampler_config=config, seed=[1, 2], batching="lockstep", return_trace=True,
                         max_new_tokens=32, max_denoising_steps=steps, trace_top_k=4, stability_threshold=0)
    return out.trace


def acceptance(trace):
    return run_checks(trace, recorded_sampler_config(trace.manifest), None, Tolerances())["acceptance"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_clean_run_records_the_draws_and_passes(saved_pair, name, one_thread):
    trace = run(saved_pair[2], CONFIGS[name])
    t = trace.tensors
    assert t["draw_ids"].shape == t["argmax"].shape and t["draw_logprobs"].dtype == torch.float32
    result = acceptance(trace)
    assert result.status == "pass" and result.checked > 0 and result.reason == "", result.first
    checks = run_checks(trace, recorded_sampler_config(trace.manifest), None, Tolerances())
    assert checks["renoise"].status == "pass", checks["renoise"]


def test_without_the_draws_the_check_is_partial_and_says_so(saved_pair, tmp_path, capsys, one_thread):
    trace = run(saved_pair[2], CONFIGS["block_refinement"])
    del trace.tensors["draw_ids"], trace.tensors["draw_logprobs"]
    result = acceptance(trace)
    assert result.status == "pass" and result.reason.startswith("partial: the trace lacks `draw_ids`")
    trace.save(tmp_path / "t")  # a foreign trace without the optional fields still compares, and says what it lacks
    capsys.readouterr()
    assert main(["compare", "--model", str(saved_pair[0]), "--trace", str(tmp_path / "t"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert list(summary["partial_checks"]) == ["acceptance"] and summary["skipped_checks"] == {}
    assert main(["compare", "--model", str(saved_pair[0]), "--trace", str(tmp_path / "t")]) == 0
    assert "check acceptance         PASS (partial: the trace lacks `draw_ids`" in capsys.readouterr().out


def test_a_trace_with_only_one_of_the_draw_fields_is_malformed(saved_pair, tmp_path, one_thread):
    trace = run(saved_pair[2], CONFIGS["block_refinement"])
    del trace.tensors["draw_logprobs"]
    with pytest.raises(TraceFormatError, match="`draw_ids` and `draw_logprobs` go together"):
        validate(trace)  # what load_trace (and save) run
    trace = run(saved_pair[2], CONFIGS["block_refinement"])
    trace.tensors["draw_ids"][0, 0, 0] = 128
    with pytest.raises(TraceFormatError, match=r"tensor `draw_ids` holds token ids outside \[0, vocab_size=128\)"):
        validate(trace)


def least_probable_first(committed, confidence, threshold, factor, real=confidence_threshold.threshold_commits):
    """Planted: the probabilities turned around (1 - p), so the least probable draws pass the bar."""
    return real(committed, -confidence + 1, threshold, factor)


def least_probable_quota(committed, confidence, step, max_steps, threshold, real=block_refinement.quota_commits):
    """Planted: the quota filled with the least probable draws."""
    return real(committed, 1 - confidence, step, max_steps, threshold)


def shifted_time_grid(canvas, x0, i, predictors, vocab_size, real=discrete_ddim.route_probabilities):
    """Planted: an off-by-one time grid (alpha_s = (i + 1) / (P + 1)): the last step no longer takes x0 everywhere."""
    return real(canvas, x0, i, predictors + 1, vocab_size)


def no_stay_route(canvas, x0, i, predictors, vocab_size, real=discrete_ddim.route_probabilities):
    """Planted: the clean route's x_t == x0 term dropped (a position whose x0 equals x_t rarely takes it)."""
    return real(canvas, torch.where(canvas == x0, (x0 + 1) % vocab_size, x0), i, predictors, vocab_size)


PLANTED = {
    "confidence_threshold": (confidence_threshold, "threshold_commits", least_probable_first),
    "confidence_factor": (confidence_threshold, "threshold_commits", least_probable_first),
    "block_refinement": (block_refinement, "quota_commits", least_probable_quota),
    "discrete_ddim": (discrete_ddim, "route_probabilities", shifted_time_grid),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_wrong_acceptance_rule_fails_acceptance(saved_pair, monkeypatch, name, one_thread):
    module, function, bug = PLANTED[name]
    monkeypatch.setattr(module, function, bug)
    trace = run(saved_pair[2], CONFIGS[name])
    monkeypatch.undo()  # the check must judge by the true rule
    result = acceptance(trace)
    assert result.status == "fail", result
    assert result.first.check == "acceptance" and result.first.canvas == 0
    print(f"{name}: {result.first}")


def test_ddim_route_statistics_catch_a_wrong_route_rule(saved_pair, monkeypatch, one_thread):
    """On a sharp model x0 often equals x_t; dropping that term of the clean route makes those positions move
    far more often than the recorded (x_t, x0) allow."""
    model = saved_pair[2]
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    try:
        clean = run(model, CONFIGS["discrete_ddim"], steps=8)
        assert acceptance(clean).status == "pass"
        monkeypatch.setattr(discrete_ddim, "route_probabilities", no_stay_route)
        trace = run(model, CONFIGS["discrete_ddim"], steps=8)
        monkeypatch.undo()  # the check must judge by the true rule
        result = acceptance(trace)
        assert result.status == "fail" and "clean routes" in result.first.detail, result
    finally:
        with torch.no_grad():
            model.lm_head.weight.div_(30)


def test_compare_fails_on_a_planted_rule_and_names_acceptance(saved_pair, monkeypatch, tmp_path, capsys, one_thread):
    path, _, model = saved_pair
    monkeypatch.setattr(block_refinement, "quota_commits", least_probable_quota)
    run(model, CONFIGS["block_refinement"]).save(tmp_path / "t")
    assert load_trace(tmp_path / "t").tensors["draw_ids"].dtype == torch.int32
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t"), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert "acceptance" in summary["failed_checks"] and summary["first_failure"]["check"] == "acceptance"
