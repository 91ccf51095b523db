"""Traces of the commit-style samplers: the manifest records the sampler and its settings, and `compare` replays
them with that sampler (the decisions of a greedy draft depend on the logits only, so our own trace agrees)."""

import json

import pytest
import torch

from diffusiongemma import BlockRefinementSamplerConfig, ConfidenceThresholdSamplerConfig, DiscreteDDIMSamplerConfig
from diffusiongemma.accuracy import load_trace
from diffusiongemma.accuracy.replay import replay_plan
from diffusiongemma.cli import main


@pytest.mark.parametrize("config", [BlockRefinementSamplerConfig(greedy=True, threshold=0.5),
                                    ConfidenceThresholdSamplerConfig(greedy=True, factor=1.0)],
                         ids=lambda c: type(c).__name__)
def test_compare_replays_a_commit_sampler_trace(saved_pair, tmp_path, capsys, config, one_thread):
    path, _, model = saved_pair
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids, sampler_config=config, seed=1, batching="lockstep", return_trace=True,
                         max_new_tokens=32, max_denoising_steps=4, trace_top_k=128)  # k = V: exact self-conditioning
    out.trace.save(tmp_path / "t")
    trace = load_trace(tmp_path / "t")
    assert trace.manifest["generation_config"]["sampler_config"] == config.to_dict()
    assert type(replay_plan(model, trace).sampler).__name__ == type(config).__name__.replace("Config", "")
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["passed"]
    assert {s["top1"] for s in summary["steps"]} == {1.0} and {s["accepted"] for s in summary["steps"]} == {1.0}


def test_compare_replays_discrete_ddim_with_its_schedule(saved_pair, tmp_path, one_thread):
    _, _, model = saved_pair
    config = DiscreteDDIMSamplerConfig(corrector_steps=1)
    out = model.generate(torch.arange(3, 9)[None], sampler_config=config, seed=1, return_trace=True,
                         max_new_tokens=16, max_denoising_steps=5)
    out.trace.save(tmp_path / "t")
    plan = replay_plan(model, load_trace(tmp_path / "t"))
    assert plan.sampler.config == config and plan.sampler.schedule[1] == (0, True)  # P0 C0 P1 C1 P2
