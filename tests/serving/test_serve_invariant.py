"""`ServingScheduler(batch_invariant=True)` (`serve --batch-invariant`): requests arriving at random passes, with
different prompt lengths, samplers and settings (so partners are in prefill, commit or denoising, and in other plans),
each get hidden states, step outputs and tokens bit-identical to `generate(..., batch_invariant=True)` run alone."""

import random
import time

import pytest
import torch

from conftest import tiny_config, tiny_model
from job_recorder import JobRecorder

from diffusiongemma import DiffusionGemmaGenerationConfig
from diffusiongemma.serving.scheduler import Job, ServingScheduler
from diffusiongemma.serving.settings import request_settings

from invariant_helpers import CONFIGS, StepLog, bit_equal

pytestmark = pytest.mark.usefixtures("one_thread")
CONFIG = DiffusionGemmaGenerationConfig(eos_token_id=1, pad_token_id=0, max_denoising_steps=4, stability_threshold=0,
                                        confidence_threshold=0.8)


def random_body(rng: random.Random) -> dict:
    body = {"max_tokens": rng.choice([8, 20, 40]), "seed": rng.randrange(10**6),
            "max_denoising_steps": rng.choice([2, 3, 5]), "t_min": rng.choice([0.1, 0.4])}
    if rng.random() < 0.4:
        body["entropy_bound"] = rng.choice([0.5, 2.0])  # the entropy-bound sampler: another plan
    if rng.random() < 0.3:
        body["confidence_threshold"] = 1e-9
    return body


def serve_and_compare(model, rng: random.Random, batch_invariant: bool, requests: int):
    """Submit `requests` random requests, each once the scheduler ran a random number of passes; returns per request
    (prompt, settings, wait), its `JobRecorder`, and the most rows that shared a pass."""
    V = model.config.text_config.vocab_size
    jobs = []
    for _ in range(requests):
        prompt = torch.randint(3, V, (rng.randint(2, 30),), generator=torch.Generator().manual_seed(rng.randrange(99)))
        jobs.append((prompt, request_settings(random_body(rng), CONFIG), rng.randint(0, 6)))
    scheduler = ServingScheduler(model, max_batch_size=rng.randint(2, requests), max_queue=requests,
                                 max_model_len=256, batch_invariant=batch_invariant)
    recorders = []
    try:
        start = 0
        for prompt, settings, wait in jobs:  # arrival: `wait` more passes after the previous request
            deadline, target = time.monotonic() + 30, start + wait
            while scheduler.passes < target and scheduler.active_rows and time.monotonic() < deadline:
                time.sleep(0.0005)
            start = scheduler.passes
            recorders.append(JobRecorder())
            scheduler.submit(Job(prompt, settings, recorders[-1]))
        for r in recorders:
            assert r.done.wait(120) and r.error is None, r.error
    finally:
        scheduler.shutdown()
    return jobs, recorders, scheduler.peak_rows


@pytest.mark.parametrize("case", range(len(CONFIGS)))
def test_invariant_server_rows_are_bit_identical_to_generate_alone(case, monkeypatch):
    rng = random.Random(100 + case)
    model = tiny_model(tiny_config(**CONFIGS[case]), seed=case)
    model.generation_config = CONFIG
    log = StepLog(monkeypatch)
    jobs, recorders, peak = serve_and_compare(model, rng, True, requests=rng.randint(3, 5))
    assert peak >= 2  # requests shared passes
    served = log.take()  # request k is row id k (1-based)
    for k, ((prompt, s, _), rec) in enumerate(zip(jobs, recorders), start=1):
        alone = model.generate(prompt[None], generation_config=s.config, sampling=s.sampling, seed=s.seed,
                               max_new_tokens=s.max_new_tokens, batch_invariant=True).sequences[0, len(prompt):]
        tokens = torch.cat(rec.canvases[1:])  # [0] is the prompt
        assert bit_equal(served[k], log.take(0))
        assert torch.equal(tokens, alone[: len(tokens)]) and len(tokens) == len(alone)


def test_default_server_is_not_bit_invariant(monkeypatch):
    """Without the switch, requests sharing passes change each other's hidden states (CPU rounding by batch shape):
    some request's steps differ from its solo run, bit for bit."""
    rng = random.Random(7)
    model = tiny_model(tiny_config(**CONFIGS[2]), seed=2)
    model.generation_config = CONFIG
    log = StepLog(monkeypatch)
    jobs, recorders, peak = serve_and_compare(model, rng, False, requests=4)
    assert peak >= 2
    served = log.take()
    same = []
    for k, (prompt, s, _) in enumerate(jobs, start=1):
        model.generate(prompt[None], generation_config=s.config, sampling=s.sampling, seed=s.seed,
                       max_new_tokens=s.max_new_tokens, batching="mixed")
        same.append(bit_equal(served[k], log.take(0)))
    assert not all(same)


def test_serve_flag_reaches_the_scheduler(monkeypatch):
    """`diffusiongemma serve --batch-invariant` -> ServeOptions -> the generation state's scheduler options."""
    pytest.importorskip("uvicorn")
    import uvicorn

    import diffusiongemma.serving.app as app_module
    from diffusiongemma.cli import build_parser
    from diffusiongemma.serving.engine import DiffusionGenerationState

    seen = {}

    class Served:
        app, state = None, type("S", (), {"shutdown": staticmethod(lambda: None)})

    monkeypatch.setattr(app_module, "build_app", lambda options: seen.setdefault("options", options) and Served)
    # `serve` runs a `uvicorn.Server` (serving/cli.py `StoppingServer`): pretend it started and stopped
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: setattr(self, "started", True))
    for argv, want in ((["serve", "--model", "m", "--batch-invariant"], True), (["serve", "--model", "m"], False)):
        seen.clear()
        args = build_parser().parse_args(argv)
        assert args.func(args) == 0
        assert seen["options"].batch_invariant is want
    manager = DiffusionGenerationState(max_batch_size=2, batch_invariant=True).get_manager("m")
    assert manager.options["batch_invariant"] is True
    with pytest.raises(TypeError, match="batch_invariant"):
        ServingScheduler(tiny_model(tiny_config(**CONFIGS[0])), batch_invariant="yes")
