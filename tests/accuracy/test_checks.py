"""The algorithm checks of `compare` (accuracy/checks.py): each one passes on our own trace, fails on a trace that
breaks its rule (naming canvas, step, row, position), is skipped only when its field is missing; foreign `sampling`
names are accepted (issue 37). On the bundled Sudoku model, which converges (and stops) in a few steps."""

import copy
import json
import random

import pytest
import torch

from diffusiongemma.accuracy.checks import Tolerances, recorded_sampler_config, run_checks
from diffusiongemma.accuracy.replay import replay_stopper
from diffusiongemma.cli import main
from diffusiongemma.sudoku import make_puzzle
from diffusiongemma.sudoku.demo import DEMO_MODEL, load_demo_model
from diffusiongemma.sudoku.tokenizer import encode_puzzle

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "model.safetensors").exists(), reason="no bundled model")


@pytest.fixture(scope="module")
def sudoku():
    model, tokenizer = load_demo_model()
    rng = random.Random(0)
    ids = torch.tensor([encode_puzzle(tokenizer, make_puzzle(rng, 45)[0]) for _ in range(2)])
    torch.manual_seed(0)
    trace = model.generate(ids, max_denoising_steps=8, return_trace=True, trace_top_k=4,
                           trace_sc_embedding=True).trace
    assert bool(trace.tensors["stopped"][-1].all())  # it converged and stopped
    return model, trace


def checks_of(model, trace, **tol):
    return run_checks(trace, recorded_sampler_config(trace.manifest), replay_stopper(trace, model), Tolerances(**tol))


def edited(trace, **edits):
    t = copy.deepcopy(trace)
    for name, edit in edits.items():
        t.tensors[name] = edit(t.tensors[name].clone())
    return t


def test_our_own_trace_passes_every_check(sudoku):
    model, trace = sudoku
    results = checks_of(model, trace)
    assert {n: r.status for n, r in results.items()} == dict.fromkeys(results, "pass")
    assert all(r.checked > 0 for r in results.values())


def _set(index, value):
    def edit(x):
        x[index] = value
        return x
    return edit


def _shift(x):
    P = x.shape[1] - 82
    x[:, P:] = torch.roll(x[:, P:], 1, dims=1)
    return x


CASES = {  # check -> (edits, expected first failure (step, row, position))
    "temperature": ({"temperature": lambda x: x.flip(0)}, (0, None, None)),
    "self_conditioning": ({"sc_embedding": _set((0, 1, 5, 0), 1e-3)}, (0, 1, 5)),
    "stop": ({"stopped": _set((1, 0), True)}, (1, 0, None)),
    "commit": ({"sequences": _shift}, (2, 0, 0)),
    "acceptance": ({"accepted": lambda x: x.logical_not_()}, (0, 0, 0)),
}


@pytest.mark.parametrize("check", list(CASES))
def test_a_broken_rule_fails_its_check_naming_where(sudoku, check):
    model, trace = sudoku
    edits, (step, row, position) = CASES[check]
    results = checks_of(model, edited(trace, **edits))
    assert results[check].status == "fail"
    first = results[check].first
    assert (first.canvas, first.step, first.row) == (0, step, row)
    assert position is None or first.position == position


def test_self_conditioning_from_another_distribution_fails(sudoku):
    model, trace = sudoku
    broken = edited(trace, sc_logprobs=lambda x: x * 1.2)  # e.g. untempered: a different distribution
    result = checks_of(model, broken)["self_conditioning"]
    assert result.status == "fail" and result.first.step == 1
    assert checks_of(model, broken, sc_logprob=10.0)["self_conditioning"].status == "pass"  # the flag widens it


def test_kept_samples_fail_renoise(sudoku):
    model, trace = sudoku
    t = copy.deepcopy(trace)
    # the step-1 input keeps step 0's argmax where step 0 did not accept (the previous sample instead of noise)
    refused = ~t.tensors["accepted"][0]
    t.tensors["input_canvas"][1] = torch.where(refused, t.tensors["argmax"][0], t.tensors["input_canvas"][1])
    result = checks_of(model, t)["renoise"]
    assert result.status == "fail" and (result.first.step, result.first.row) == (0, 0)


def test_a_missing_field_skips_only_its_checks(sudoku):
    model, trace = sudoku
    t = copy.deepcopy(trace)
    t.manifest["generation_config"] = {k: v for k, v in t.manifest["generation_config"].items()
                                       if k not in ("t_min", "sampler_config")}
    results = checks_of(model, t)
    assert {n for n, r in results.items() if r.status == "skipped"} == {"temperature", "acceptance", "renoise"}
    assert "t_min" in results["temperature"].reason
    assert results["stop"].status == results["commit"].status == "pass"


def test_compare_judges_checks_and_accepts_a_foreign_sampling_name(sudoku, tmp_path, capsys):
    model, trace = sudoku
    foreign = copy.deepcopy(trace)
    foreign.manifest["sampling"] = "some-engine-v2"  # an engine's own name: its draws are never needed
    foreign.save(tmp_path / "foreign")
    args = ["compare", "--model", str(DEMO_MODEL), "--trace", str(tmp_path / "foreign"), "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["passed"] and summary["first_failure"] is None and summary["skipped_checks"] == {}
    assert set(summary["checks"]) == {"model", "temperature", "self_conditioning", "stop", "commit", "acceptance",
                                      "renoise"}
    edited(foreign, stopped=_set((1, 1), True)).save(tmp_path / "early")
    assert main(["compare", "--model", str(DEMO_MODEL), "--trace", str(tmp_path / "early"), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["failed_checks"] == ["stop"]
    assert {k: summary["first_failure"][k] for k in ("check", "canvas", "step", "row", "position")} == {
        "check": "stop", "canvas": 0, "step": 1, "row": 1, "position": None}
    assert main(["compare", "--model", str(DEMO_MODEL), "--trace", str(tmp_path / "early")]) == 1
    table = capsys.readouterr().out
    assert "check stop" in table and "first failure: check stop at canvas 0, step 1, row 1" in table


@pytest.mark.parametrize("config_name", ["BlockRefinementSamplerConfig", "ConfidenceThresholdSamplerConfig",
                                         "DiscreteDDIMSamplerConfig"])
def test_every_sampler_passes_by_its_own_rule(sudoku, config_name):
    import diffusiongemma.generation.sampler as samplers

    model, _ = sudoku
    rng = random.Random(0)
    ids = torch.tensor([encode_puzzle(load_demo_model()[1], make_puzzle(rng, 45)[0]) for _ in range(2)])
    trace = model.generate(ids, max_denoising_steps=8, return_trace=True, trace_top_k=4, sampling="fast", seed=1,
                           batching="lockstep", sampler_config=getattr(samplers, config_name)()).trace
    results = checks_of(model, trace)
    assert [n for n, r in results.items() if r.status == "fail"] == []
    assert [n for n, r in results.items() if r.status == "skipped"] == []  # the draws are recorded: DDIM judged too
    assert results["acceptance"].status == "pass" and results["acceptance"].reason == ""
    if config_name == "DiscreteDDIMSamplerConfig":
        return
    broken = edited(trace, accepted=_set((1, 0), False))  # step 1 forgets every committed position of row 0
    result = checks_of(model, broken)["acceptance"]
    assert result.status == "fail" and (result.first.step, result.first.row) == (1, 0)
