"""Samplers, stoppers and processors as plug-ins: the user-defined sampler and stopper of docs/generation.md, run
exactly as written, through lock-step, mixed and chunked `generate`, the server (settings sent per request, over the
scheduler and over HTTP) and trace recording and replay; their configs round-trip through generation_config.json;
per-position processors see the same rows in every mode."""

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


def doc_example(name: str) -> dict:
    """Run one of the docs' plug-in examples in a fresh namespace (the same code a user copies)."""
    text = DOC.read_text()
    code = re.search(rf"<!-- user-{name}-example -->\n```python\n(.*?)```", text, re.S).group(1)
    namespace = {"__name__": f"user_{name}_example"}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


EXAMPLE = doc_example("sampler")
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


STOPPER = doc_example("stopper")
StopperConfig = STOPPER["PatienceStopperConfig"]
ALWAYS_CALM = 1e9  # every step counts as calm: each canvas takes exactly `patience` passes


def passes_per_canvas(out, model) -> torch.Tensor:
    """[B] denoising passes per canvas, from `tokens_per_forward` (new tokens / passes)."""
    return (KW["max_new_tokens"] / out.tokens_per_forward.double()) / (KW["max_new_tokens"] // model.canvas_length)


def test_doc_stopper_in_lockstep_mixed_and_chunks(model):
    ids = torch.randint(3, 100, (3, 5), generator=torch.Generator().manual_seed(3))
    config = StopperConfig(max_entropy=ALWAYS_CALM, patience=3)
    runs = {batching: model.generate(ids, stopper_config=config, sampling="fast", seed=[1, 2, 3], **extra, **KW)
            for batching, extra in [("lockstep", dict(batching="lockstep")),
                                    ("mixed", dict(batching="mixed", max_batch_size=2)),
                                    ("chunks", dict(batching="lockstep", max_batch_size=1))]}
    for batching, out in runs.items():
        assert passes_per_canvas(out, model).tolist() == pytest.approx([3.0] * 3), batching
    assert torch.equal(runs["lockstep"].sequences, runs["mixed"].sequences)
    assert torch.equal(runs["lockstep"].sequences, runs["chunks"].sequences)
    # the stopper's own rule decides: patience 1 stops after one pass, and the built-in stopper differs from both
    once = model.generate(ids, stopper_config=StopperConfig(max_entropy=ALWAYS_CALM, patience=1), seed=[1, 2, 3],
                          sampling="fast", **KW)
    assert passes_per_canvas(once, model).tolist() == pytest.approx([1.0] * 3)
    # with the doc sampler too: both plug-ins in one run
    both = model.generate(ids, stopper_config=config, sampler_config=Config(keep=4), seed=[1, 2, 3], **KW)
    assert passes_per_canvas(both, model).tolist() == pytest.approx([3.0] * 3)


def test_doc_stopper_refuses_the_builtin_fields_and_round_trips(tmp_path, model):
    ids = torch.arange(3, 8)[None]
    with pytest.raises(ValueError, match="`stability_threshold` sets the built-in stopper"):
        model.generate(ids, stopper_config=StopperConfig(), stability_threshold=2, **KW)
    with pytest.raises(ValueError, match="registered stopper config"):
        model.generate(ids, stopper_config=object(), **KW)
    with pytest.raises(ValueError, match="`patience` must be a positive int"):
        StopperConfig(patience=0)
    config = DiffusionGemmaGenerationConfig(stopper_config=StopperConfig(patience=4), max_denoising_steps=5)
    config.save_pretrained(tmp_path)
    assert '"_cls_name": "PatienceStopperConfig"' in (tmp_path / "generation_config.json").read_text()
    loaded = DiffusionGemmaGenerationConfig.from_pretrained(tmp_path)
    assert loaded.stopper_config == StopperConfig(patience=4)
    # without a plug-in stopper nothing new is saved, so transformers' own class still loads the file
    DiffusionGemmaGenerationConfig(max_denoising_steps=5).save_pretrained(tmp_path)
    assert "stopper_config" not in (tmp_path / "generation_config.json").read_text()


def test_doc_stopper_and_sampler_trace_and_replay(model):
    from diffusiongemma.accuracy.replay import replay_full

    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(4))
    stopper = StopperConfig(max_entropy=ALWAYS_CALM, patience=2)
    out = model.generate(ids, stopper_config=stopper, sampler_config=Config(keep=3), seed=0, batching="lockstep",
                         return_trace=True, **KW)
    trace = out.trace
    assert trace.manifest["generation_config"]["stopper_config"] == stopper.to_dict()
    assert [len(trace.steps(c)) for c in range(trace.num_canvases)] == [2, 2]  # the stopper's patience
    # replay rebuilds both plug-ins from the manifest: every stop decision and accepted mask agrees
    # (the built-in stopper would not stop after two passes)
    scores = replay_full(model, trace)
    assert scores and all(s.stop == 1.0 and s.accepted == 1.0 for s in scores)


def test_doc_plugins_serve_with_settings_per_request(model):
    prompt = torch.arange(3, 10)
    base = DiffusionGemmaGenerationConfig(eos_token_id=None, pad_token_id=0,
                                          stopper_config=StopperConfig(max_entropy=ALWAYS_CALM, patience=2))
    body = {"max_tokens": 32, "seed": 3, "max_denoising_steps": 6, "sampler": "TopConfidenceSamplerConfig",
            "sampler_settings": {"keep": 5}, "stopper_settings": {"patience": 3}}
    settings = request_settings(body, base)
    assert settings.config.stopper_config == StopperConfig(max_entropy=ALWAYS_CALM, patience=3)
    got = served(model, prompt, settings, None)
    expected = model.generate(prompt[None], sampler_config=Config(keep=5), seed=3,
                              stopper_config=StopperConfig(max_entropy=ALWAYS_CALM, patience=3), **KW)
    assert torch.equal(got, expected.sequences[0, len(prompt):])


@pytest.mark.parametrize("body,field", [
    ({"sampler": "TopConfidenceSamplerConfig", "sampler_settings": {"keep": 0}}, "sampler_settings.keep"),
    ({"sampler": "TopConfidenceSamplerConfig", "sampler_settings": {"keep": "all"}}, "sampler_settings.keep"),
    ({"sampler": "TopConfidenceSamplerConfig", "sampler_settings": {"nope": 1}}, "sampler_settings.nope"),
    ({"sampler": "TopConfidenceSamplerConfig", "sampler_settings": [5]}, "sampler_settings"),
    ({"stopper_settings": {"patience": -1}}, "stopper_settings.patience"),
    ({"stopper_settings": {"max_entropy": "x"}}, "stopper_settings.max_entropy"),
    ({"stopper_settings": {"window": 2}}, "stopper_settings.window"),
    ({"stability_threshold": 2}, "stability_threshold"),  # the server runs the plug-in stopper
    ({"stopper": "nope"}, "stopper"),
    ({"stopper": 3}, "stopper"),
    ({"stopper": "stable-and-confident", "stopper_settings": {"patience": 2}}, "stopper_settings"),
])
def test_bad_plugin_settings_name_the_field(body, field):
    from diffusiongemma.serving.settings import BadRequestField

    base = DiffusionGemmaGenerationConfig(eos_token_id=None, pad_token_id=0, stopper_config=StopperConfig())
    with pytest.raises(BadRequestField) as error:
        request_settings(body, base)
    assert error.value.field == field and f"`{field}`" in str(error.value)


def test_a_request_picks_its_stopper():
    builtin = DiffusionGemmaGenerationConfig(eos_token_id=None, pad_token_id=0)
    picked = request_settings({"stopper": "PatienceStopperConfig", "stopper_settings": {"patience": 4}}, builtin)
    assert picked.config.stopper_config == StopperConfig(patience=4)
    assert request_settings({"stopper": "PatienceStopperConfig"}, builtin).config.stopper_config == StopperConfig()
    plugin = DiffusionGemmaGenerationConfig(eos_token_id=None, pad_token_id=0, stopper_config=StopperConfig(patience=5))
    back = request_settings({"stopper": "stable-and-confident", "stability_threshold": 2}, plugin).config
    assert back.stopper_config is None and back.stability_threshold == 2


def test_stopper_settings_need_a_plugin_stopper():
    from diffusiongemma.serving.settings import BadRequestField

    with pytest.raises(BadRequestField, match="built-in stopper") as error:
        request_settings({"stopper_settings": {"patience": 2}}, DiffusionGemmaGenerationConfig())
    assert error.value.field == "stopper_settings"


def test_http_plugins_and_400(tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    import json
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "serving"))
    from serve_checkpoint import write_checkpoint

    from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app

    path = write_checkpoint(tmp_path)
    config_file = tmp_path / "generation_config.json"
    saved = json.loads(config_file.read_text())
    saved.update(stopper_config=StopperConfig(max_entropy=ALWAYS_CALM, patience=2).to_dict())
    del saved["stability_threshold"], saved["confidence_threshold"]
    config_file.write_text(json.dumps(saved))
    served_app = build_app(ServeOptions(model=path, max_model_len=256, max_batch_size=2, max_queue=4))
    server = BackgroundServer(served_app.app).start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
        extra = {"sampler": "TopConfidenceSamplerConfig", "sampler_settings": {"keep": 5},
                 "stopper_settings": {"patience": 3}}
        reply = client.completions.create(model=path, prompt="abc", max_tokens=16, seed=2, extra_body=extra)
        ids = served_app.tokenizer("abc", return_tensors="pt")["input_ids"]
        new = served_app.model.generate(ids, sampler_config=Config(keep=5), seed=2, max_new_tokens=16,
                                        stopper_config=StopperConfig(max_entropy=ALWAYS_CALM, patience=3)
                                        ).sequences[0, ids.shape[1]:].tolist()[:16]
        new = new[: new.index(1) + 1] if 1 in new else new
        assert reply.choices[0].text == served_app.tokenizer.decode(new, skip_special_tokens=True)
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=path, prompt="abc", max_tokens=16,
                                      extra_body={"sampler": "TopConfidenceSamplerConfig",
                                                  "sampler_settings": {"keep": 0}})
        assert error.value.body["param"] == "sampler_settings.keep" and "`keep`" in error.value.message
    finally:
        server.stop()
        served_app.state.shutdown()


def test_a_stopper_config_changed_after_construction_is_checked_again(model):
    config = StopperConfig()
    config.patience = 0  # its __post_init__ never saw this
    with pytest.raises(ValueError, match="`patience` must be a positive int"):
        model.generate(torch.arange(3, 8)[None], stopper_config=config, **KW)


@dataclasses.dataclass
class ArgmaxConfig:
    """A global-RNG plug-in: the base class's canvas, every position its argmax at once."""

    def to_dict(self):
        return {"_cls_name": type(self).__name__}


class ArgmaxSampler(diffusiongemma.BaseSampler):
    per_row = False  # the base class draws its noise canvas from the global RNG

    def step(self, logits, canvas, temperature, step, generators, soft_embed=None):
        argmax = logits.argmax(dim=-1)  # [B, L]
        entropy = torch.zeros(argmax.shape)
        return diffusiongemma.StepOutput(argmax, argmax, torch.ones_like(argmax, dtype=torch.bool), entropy)


diffusiongemma.register_sampler(ArgmaxConfig, ArgmaxSampler, sampling="reference")


def test_base_sampler_defaults(model):
    """`BaseSampler`: a uniform noise canvas (global RNG here), no state (`step` gets no `state=`)."""
    sampler = ArgmaxSampler(ArgmaxConfig(), diffusiongemma.SamplerContext(vocab_size=128, max_steps=4))
    assert sampler.init_state(2, 16, torch.device("cpu")) is None
    torch.manual_seed(7)
    first = sampler.init_canvas(2, 16, torch.device("cpu"), None)
    torch.manual_seed(7)
    assert torch.equal(first, torch.randint(0, 128, (2, 16)))
    ids = torch.arange(3, 8)[None]
    torch.manual_seed(0)
    out = model.generate(ids, sampler_config=ArgmaxConfig(), **KW)
    with pytest.raises(ValueError, match="need.*per row"):  # a global-RNG sampler refuses mixed batching, as built-ins
        model.generate(torch.cat([ids, ids]), sampler_config=ArgmaxConfig(), batching="mixed", **KW)
    torch.manual_seed(0)
    again = model.generate(ids, sampler_config=ArgmaxConfig(), **KW)
    assert torch.equal(out.sequences, again.sequences)  # the global RNG, seeded, fixes the noise canvas


def test_register_stopper_checks_its_arguments():
    class NoState:
        def __call__(self, argmax_canvas, entropy, state):
            return entropy.mean(-1) < 1, state

    with pytest.raises(TypeError, match="init_state"):
        diffusiongemma.register_stopper(StopperConfig, NoState)
    with pytest.raises(TypeError, match="to_dict"):
        diffusiongemma.register_stopper(object, STOPPER["PatienceStopper"])
    with pytest.raises(NotImplementedError, match="__call__"):
        diffusiongemma.BaseStopper(None)(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4), None)
