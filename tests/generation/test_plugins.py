"""Samplers, stoppers and processors as plug-ins: the user-defined sampler of docs/generation.md, run exactly as
written, through lock-step and mixed `generate`, the server's scheduler and trace recording; its config round-trips
through generation_config.json; per-position processors see the same rows in every mode."""

import dataclasses
import pathlib
import re

import pytest
import torch

from conftest import tiny_model
from job_recorder import JobRecorder

import diffusiongemma
from diffusiongemma import DiffusionGemmaGenerationConfig
from diffusiongemma.serving.scheduler import Job, ServingScheduler
from diffusiongemma.serving.settings import request_settings

pytestmark = pytest.mark.usefixtures("one_thread")
DOC = pathlib.Path(__file__).parents[2] / "docs" / "generation.md"
KW = dict(max_new_tokens=32, max_denoising_steps=6, eos_token_id=None, pad_token_id=0)


def doc_example() -> dict:
    """Run the docs' sampler example in a fresh namespace (the same code a user copies)."""
    text = DOC.read_text()
    code = re.search(r"<!-- user-sampler-example -->\n```python\n(.*?)```", text, re.S).group(1)
    namespace = {"__name__": "user_sampler_example"}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


EXAMPLE = doc_example()
Config = EXAMPLE["TopConfidenceSamplerConfig"]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_doc_sampler_in_lockstep_and_mixed(model):
    ids = torch.randint(3, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    config = Config(keep=4)
    lock = model.generate(ids, sampler_config=config, seed=[1, 2, 3], batching="lockstep", **KW)
    mixed = model.generate(ids, sampler_config=config, seed=[1, 2, 3], batching="mixed", max_batch_size=2, **KW)
    assert lock.sequences.shape == (3, 5 + 32)
    # equal prompt lengths, per-row generators: each row's tokens equal in both batchings (up to float rounding
    # between batch shapes, which a tiny fp32 model at these sizes does not reach)
    assert torch.equal(lock.sequences, mixed.sequences)
    alone = model.generate(ids[1:2], sampler_config=config, seed=[2], **KW)
    assert torch.equal(alone.sequences[0], lock.sequences[1])
    # the sampler's rule runs: with keep=L every position is accepted at once, so a canvas needs fewer passes
    everything = model.generate(ids, sampler_config=Config(keep=model.canvas_length), seed=[1, 2, 3], **KW)
    assert everything.tokens_per_forward.float().mean() >= lock.tokens_per_forward.float().mean()


def test_doc_sampler_trace_records_its_accepted_mask(model):
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, sampler_config=Config(keep=3), seed=0, batching="lockstep", return_trace=True, **KW)
    trace = out.trace
    accepted = trace.tensors["accepted"]  # [R, B, L]
    active = trace.tensors["active"]
    assert bool((accepted.sum(-1)[active] == 3).all())  # exactly `keep` positions per running row and step
    assert trace.manifest["generation_config"]["sampler_config"] == {"keep": 3, "_cls_name": "TopConfidenceSamplerConfig"}


def test_doc_sampler_config_round_trips(tmp_path):
    config = DiffusionGemmaGenerationConfig(sampler_config=Config(keep=7), max_denoising_steps=5)
    config.save_pretrained(tmp_path)
    loaded = DiffusionGemmaGenerationConfig.from_pretrained(tmp_path)
    assert isinstance(loaded.sampler_config, Config) and loaded.sampler_config.keep == 7
    with pytest.raises(ValueError, match="not a registered sampler config"):
        DiffusionGemmaGenerationConfig(sampler_config={"_cls_name": "NoSuchConfig", "x": 1})


class BanEvenTokensAfterOffset:
    """A per-position processor: bans even token ids in row positions >= 40 (absolute), using `position_offsets`."""

    def __call__(self, input_ids, scores, position_offsets):
        B, L, V = scores.shape
        positions = torch.tensor(position_offsets)[:, None] + torch.arange(L)[None]  # [B', L]
        banned = (positions >= 40)[:, :, None] & (torch.arange(V) % 2 == 0)[None, None]
        return scores.masked_fill(banned, float("-inf"))


def served(model, prompt, settings, processors):
    scheduler = ServingScheduler(model, max_batch_size=2, max_queue=4, max_model_len=256, logits_processor=processors)
    try:
        rec = JobRecorder()
        scheduler.submit(Job(prompt, settings, rec))
        assert rec.done.wait(60) and rec.error is None, rec.error
        return torch.cat(rec.canvases[1:])
    finally:
        scheduler.shutdown()


def test_processors_apply_alike_in_lockstep_mixed_and_the_server(model):
    prompt = torch.arange(3, 12)
    processors = [BanEvenTokensAfterOffset()]
    lock = model.generate(prompt[None], sampling="fast", seed=5, logits_processor=processors, batching="lockstep",
                          **KW).sequences[0, len(prompt):]
    pair = torch.stack([prompt, torch.arange(30, 39)])
    mixed = model.generate(pair, sampling="fast", seed=[5, 6], logits_processor=processors, batching="mixed",
                           **KW).sequences[0, len(prompt):]
    settings = request_settings({"max_tokens": 32, "seed": 5, "max_denoising_steps": 6},
                                DiffusionGemmaGenerationConfig(eos_token_id=None, pad_token_id=0))
    server = served(model, prompt, settings, processors)
    assert torch.equal(lock, mixed) and torch.equal(lock, server)
    positions = torch.arange(len(prompt), len(prompt) + 32)
    assert bool((lock[positions >= 40] % 2 == 1).all())  # the processor ran with the right offsets
    plain = model.generate(prompt[None], sampling="fast", seed=5, **KW).sequences[0, len(prompt):]
    assert not torch.equal(plain, lock)


def test_doc_sampler_serves(model):
    prompt = torch.arange(3, 10)
    config = DiffusionGemmaGenerationConfig(eos_token_id=None, pad_token_id=0, sampler_config=Config(keep=5))
    settings = request_settings({"max_tokens": 32, "seed": 3, "max_denoising_steps": 6}, config)
    got = served(model, prompt, settings, None)
    expected = model.generate(prompt[None], sampler_config=Config(keep=5), seed=3, **KW).sequences[0, len(prompt):]
    assert torch.equal(got, expected)


def test_register_sampler_checks_its_arguments():
    class NoFlag:
        def __init__(self, config, context):
            pass

    with pytest.raises(TypeError, match="per_row"):
        diffusiongemma.register_sampler(Config, NoFlag)
    with pytest.raises(ValueError, match="must be a registered sampler config"):
        torch.manual_seed(0)
        tiny_model().generate(torch.arange(3, 8)[None], sampler_config=object(), **KW)


class CountingSampler(EXAMPLE["TopConfidenceSampler"]):
    """The docs' sampler registered under another name; counts its steps."""

    steps = 0

    def step(self, *args, **kwargs):
        type(self).steps += 1
        return super().step(*args, **kwargs)


@dataclasses.dataclass
class ChunkedConfig(Config):
    """A config class of its own, so registering "mine" for it touches no other test's registry entry."""

    def to_dict(self):
        return {"keep": self.keep, "_cls_name": type(self).__name__}


diffusiongemma.register_sampler(ChunkedConfig, EXAMPLE["TopConfidenceSampler"])  # the default ("fast")
diffusiongemma.register_sampler(ChunkedConfig, CountingSampler, sampling="mine")


def test_a_sampler_under_another_name_runs_in_lockstep_chunks(model):
    """Lock-step chunks (max_batch_size below the batch) run the sampler the call named, not the config's default."""
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    CountingSampler.steps = 0
    chunked = model.generate(ids, sampler_config=ChunkedConfig(keep=3), sampling="mine", seed=[1, 2],
                             batching="lockstep", max_batch_size=1, **KW)
    assert CountingSampler.steps > 0
    whole = model.generate(ids, sampler_config=ChunkedConfig(keep=3), sampling="mine", seed=[1, 2],
                           batching="lockstep", **KW)
    assert torch.equal(chunked.sequences, whole.sequences)  # equal prompt lengths: each row as in one batch
