"""serving/scheduler.py without HTTP: a request that arrives while another is denoising joins the running pool at a
step boundary, and both rows' tokens equal `generate(sampling="fast", seed=...)` run alone."""

import threading
import time

import pytest
import torch

from conftest import tiny_model

from diffusiongemma import DiffusionGemmaGenerationConfig
from diffusiongemma.serving.scheduler import Job, QueueFull, ServingScheduler
from diffusiongemma.serving.settings import request_settings

pytestmark = pytest.mark.usefixtures("one_thread")
CONFIG = DiffusionGemmaGenerationConfig(eos_token_id=1, pad_token_id=0, max_denoising_steps=8, stability_threshold=0,
                                        confidence_threshold=0.8)


class Recorder:
    """The streamer interface the scheduler drives, recording committed canvases and the pass count at each call."""

    def __init__(self, scheduler, drafts=False):
        self.scheduler, self.drafts = scheduler, drafts
        self.canvases, self.draft_passes, self.step = [], [], 0
        self.abandoned = False
        self.done = threading.Event()

    def put(self, value):
        self.canvases.append(value.reshape(-1))

    def put_draft(self, value=None, logits=None):
        self.draft_passes.append(self.scheduler.passes)

    def end(self):
        self.done.set()

    def fail(self, message):
        raise AssertionError(message)


@pytest.fixture(scope="module")
def model():
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.generation_config = CONFIG
    return model


def solo(model, prompt, seed, max_tokens, **kw):
    out = model.generate(prompt[None], sampling="fast", seed=seed, max_new_tokens=max_tokens, **kw).sequences[0]
    return out[len(prompt):]


def test_a_late_request_joins_the_running_pool(model):
    scheduler = ServingScheduler(model, max_batch_size=4, max_queue=4, max_model_len=512)
    try:
        first, late = torch.arange(3, 12), torch.arange(20, 26)
        a = Recorder(scheduler, drafts=True)
        scheduler.submit(Job(first, request_settings({"max_tokens": 48, "seed": 4, "max_denoising_steps": 12,
                                                      "confidence_threshold": 1e-9}, CONFIG), a))
        deadline = time.monotonic() + 30
        while len(a.draft_passes) < 3:  # the first request is denoising
            assert time.monotonic() < deadline
            time.sleep(0.001)
        b = Recorder(scheduler, drafts=True)
        scheduler.submit(Job(late, request_settings({"max_tokens": 16, "seed": 9, "t_min": 0.1}, CONFIG), b))
        assert a.done.wait(60) and b.done.wait(60)
        assert b.draft_passes[0] < a.draft_passes[-1]  # b denoised while a was still running: they shared passes
        assert scheduler.peak_rows == 2
        got_a, got_b = torch.cat(a.canvases[1:]), torch.cat(b.canvases[1:])  # [0] is the prompt
        expected_a = solo(model, first, 4, 48, max_denoising_steps=12, confidence_threshold=1e-9)
        assert torch.equal(got_a, expected_a[: len(got_a)]) and len(got_a) == len(expected_a)
        expected_b = solo(model, late, 9, 16, t_min=0.1)
        assert torch.equal(got_b, expected_b)
    finally:
        scheduler.shutdown()


def test_queue_limit(model):
    scheduler = ServingScheduler(model, max_batch_size=1, max_queue=1, max_model_len=512)
    try:
        slow = request_settings({"max_tokens": 160, "max_denoising_steps": 40, "confidence_threshold": 1e-9}, CONFIG)
        running, waiting = Recorder(scheduler, drafts=True), Recorder(scheduler)
        scheduler.submit(Job(torch.arange(3, 9), slow, running))
        while not running.draft_passes:
            time.sleep(0.001)
        scheduler.submit(Job(torch.arange(3, 9), slow, waiting))
        with pytest.raises(QueueFull):
            scheduler.submit(Job(torch.arange(3, 9), slow, Recorder(scheduler)))
        running.abandoned = waiting.abandoned = True  # both clients leave: their rows are dropped, unfinished
        assert running.done.wait(30) and waiting.done.wait(30)
        # the running row left unfinished, the waiting request before it ran: both count as dropped
        assert len(running.canvases) < 1 + 10 and scheduler.dropped == 2
    finally:
        scheduler.shutdown()


class ExplodingStopper:
    """A stopper whose every call fails: stands for anything in one plan's step that raises."""

    def init_state(self, batch, length, device):
        return None

    def __call__(self, argmax_canvas, entropy, state):
        raise RuntimeError("this plan's stopper broke")


class FailingRecorder(Recorder):
    def fail(self, message):
        self.failure = message
        self.done.set()


def test_a_failing_plan_fails_only_its_own_request(model):
    import dataclasses

    class OnePlanBreaks(ServingScheduler):
        def _plan(self, s):
            plan = super()._plan(s)
            return dataclasses.replace(plan, stopper=ExplodingStopper()) if s.config.t_min == 0.125 else plan

    scheduler = OnePlanBreaks(model, max_batch_size=4, max_queue=4, max_model_len=512)
    try:
        good_prompt = torch.arange(3, 12)
        good, bad = Recorder(scheduler, drafts=True), FailingRecorder(scheduler)
        scheduler.submit(Job(good_prompt, request_settings({"max_tokens": 48, "seed": 4, "max_denoising_steps": 12,
                                                            "confidence_threshold": 1e-9}, CONFIG), good))
        while len(good.draft_passes) < 2:  # the good request is denoising
            time.sleep(0.001)
        scheduler.submit(Job(torch.arange(20, 26), request_settings({"max_tokens": 16, "t_min": 0.125}, CONFIG), bad))
        assert bad.done.wait(60) and "this plan's stopper broke" in bad.failure
        assert good.done.wait(60)
        expected = solo(model, good_prompt, 4, 48, max_denoising_steps=12, confidence_threshold=1e-9)
        assert torch.equal(torch.cat(good.canvases[1:]), expected)
    finally:
        scheduler.shutdown()


def test_a_request_whose_plan_cannot_be_built_fails_alone(model, monkeypatch):
    scheduler = ServingScheduler(model, max_batch_size=2, max_queue=4, max_model_len=512)
    try:
        original = scheduler._plan

        def plan(s):
            if s.config.t_min == 0.125:
                raise RuntimeError("no plan for you")
            return original(s)

        monkeypatch.setattr(scheduler, "_plan", plan)
        bad, good = FailingRecorder(scheduler), Recorder(scheduler)
        scheduler.submit(Job(torch.arange(3, 9), request_settings({"max_tokens": 16, "t_min": 0.125}, CONFIG), bad))
        scheduler.submit(Job(torch.arange(3, 9), request_settings({"max_tokens": 16, "seed": 2}, CONFIG), good))
        assert bad.done.wait(60) and "no plan for you" in bad.failure
        assert good.done.wait(60) and torch.equal(torch.cat(good.canvases[1:]), solo(model, torch.arange(3, 9), 2, 16))
    finally:
        scheduler.shutdown()
