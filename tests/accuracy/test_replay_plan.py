"""Replay builds its plan with the one plan builder from the trace's recorded settings (accuracy/replay.py,
generation/plan.py), never from hard-coded ones or the replaying model's own generation config."""

import pytest
import torch

from conftest import tiny_model
from diffusiongemma.accuracy.replay import replay_plan
from diffusiongemma.generation.entropy_bound import temperature_schedule

pytestmark = pytest.mark.usefixtures("one_thread")


def test_replay_plan_uses_the_recorded_schedule_and_stopper():
    model = tiny_model()
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    settings = dict(max_new_tokens=16, max_denoising_steps=5, t_min=0.3, t_max=0.9, stability_threshold=2,
                    confidence_threshold=0.25)
    trace = model.generate(ids, sampling="fast", seed=0, return_trace=True, **settings).trace
    # the model's own config says something else: replay must follow the trace
    model.generation_config.t_min, model.generation_config.stability_threshold = 0.01, 0
    plan = replay_plan(model, trace)
    assert plan.max_steps == 5
    assert torch.equal(plan.temperatures, temperature_schedule(5, 0.3, 0.9, torch.device("cpu")))
    assert (plan.stopper.stability_threshold, plan.stopper.confidence_threshold) == (2, 0.25)
    assert type(plan.sampler).__name__ == "FastSampler"
    # the recorded per-step temperatures are the plan's schedule, entry n (steps remaining)
    n = trace.tensors["steps_remaining"].long()
    assert torch.allclose(trace.tensors["temperature"], plan.temperatures[n])
