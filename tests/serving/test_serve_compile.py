"""The server's compiled passes (`ServingScheduler(compile=...)`, `diffusiongemma serve --compile`): concurrent
requests arriving and leaving run through one graph per row bucket over the capacity bucket fixed at startup
(`max_model_len`), with no graph break, and each request's tokens are its solo run's."""

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from diffusiongemma.serving.cli import serve_compile
from diffusiongemma.serving.scheduler import Job, ServingScheduler
from diffusiongemma.serving.settings import request_settings
from test_serve_scheduler import CONFIG, Recorder, solo
from test_serve_scheduler import model  # noqa: F401 - its sharpened tiny model, a module-scoped fixture

pytestmark = pytest.mark.usefixtures("one_thread")


def serve_round(scheduler, model, lengths: list[int], seed: int) -> None:
    """Submit one request per prompt length at once (more than the pool's slots), wait, check each against solo."""
    g = torch.Generator().manual_seed(seed)
    jobs = []
    for i, n in enumerate(lengths):
        prompt = torch.randint(3, 128, (n,), generator=g)
        settings = {"max_tokens": 16 * (1 + i % 3), "seed": seed + i}
        recorder = Recorder(scheduler)
        scheduler.submit(Job(prompt, request_settings(settings, CONFIG), recorder))
        jobs.append((prompt, settings, recorder))
    for prompt, settings, recorder in jobs:
        assert recorder.done.wait(120)
        expected = solo(model, prompt, settings["seed"], settings["max_tokens"])
        got = torch.cat(recorder.canvases[1:])  # [0] is the prompt
        assert torch.equal(got, expected[: len(got)]) and len(got) == len(expected)


def test_compiled_scheduler_serves_concurrent_requests_with_one_graph_per_bucket(model, buckets):
    counter = CompileCounter()
    counters.clear()
    scheduler = ServingScheduler(model, max_batch_size=4, max_queue=16, max_model_len=128,
                                 compile={"backend": counter})
    try:
        serve_round(scheduler, model, [6, 3, 11, 9, 2, 14], seed=0)  # warm-up: rows arrive and leave
        for lengths, seed in (([5, 12, 1, 8, 7, 4], 10), ([13, 2, 6, 10, 3], 20)):
            before, graphs = set(buckets), counter.frame_count
            serve_round(scheduler, model, lengths, seed)
            assert counter.frame_count - graphs == len(set(buckets) - before)  # only a bucket not seen before
        assert {c for _, c in buckets} == {128}  # the capacity bucket fixed at startup (--max-model-len)
        assert {r for r, _ in buckets} <= {1, 2, 4}
        assert counter.frame_count == len(set(buckets))
        assert not counters["graph_break"]
        assert scheduler.peak_rows == 4
    finally:
        scheduler.shutdown()


def test_compile_options_of_the_server(model):
    assert serve_compile(False, None) is False and serve_compile(True, None) is True
    assert serve_compile(False, "reduce-overhead") == {"mode": "reduce-overhead"}  # --compile-mode implies it
    assert serve_compile(True, "default") is True
    with pytest.raises(ValueError, match="`compile` cannot run with `batch_invariant`"):
        ServingScheduler(model, compile=True, batch_invariant=True)
    with pytest.raises(ValueError, match=r"`compile` options \['fullgraph'\]"):
        ServingScheduler(model, compile={"fullgraph": False})
