"""`diffusiongemma serve` per request: `sampler` plus its settings as body fields. Checked on the settings reader
(a bad field is named), on the scheduler (a served row equals `generate` alone) and over HTTP with the `openai`
client (the reply equals `generate`; a bad setting is a 400 naming it)."""


import dataclasses

import pytest
import torch

from conftest import tiny_model
from job_recorder import JobRecorder

from diffusiongemma import (
    BlockRefinementSamplerConfig,
    ConfidenceThresholdSamplerConfig,
    DiffusionGemmaGenerationConfig,
    DiscreteDDIMSamplerConfig,
    EntropyBoundSamplerConfig,
    sampler_preset,
)
from diffusiongemma.serving.handlers import DiffusionSettingFields
from diffusiongemma.serving.sampler_request import SAMPLER_FIELDS
from diffusiongemma.serving.scheduler import Job, ServingScheduler
from diffusiongemma.serving.settings import BadRequestField, request_settings

pytestmark = pytest.mark.usefixtures("one_thread")
BASE = DiffusionGemmaGenerationConfig(eos_token_id=None, pad_token_id=0)


@pytest.mark.parametrize("body,expected", [
    ({"sampler": "block-refinement", "threshold": 0.9}, BlockRefinementSamplerConfig(threshold=0.9)),
    ({"sampler": "block-refinement", "threshold": 1}, BlockRefinementSamplerConfig(threshold=1.0)),  # JSON int
    ({"sampler": "confidence-threshold", "factor": 0.5, "greedy": True},
     ConfidenceThresholdSamplerConfig(factor=0.5, greedy=True)),
    ({"sampler": "discrete-ddim", "corrector_steps": 2, "corrector_selection": "random"},
     DiscreteDDIMSamplerConfig(corrector_steps=2, corrector_selection="random")),
    ({"sampler": "entropy-bound"}, EntropyBoundSamplerConfig(entropy_bound=0.1)),
    ({"entropy_bound": 0.3}, EntropyBoundSamplerConfig(entropy_bound=0.3)),  # as before: no `sampler` needed
    ({}, EntropyBoundSamplerConfig(entropy_bound=0.1)),
    ({"sampler_preset": "block-refinement"}, sampler_preset("block-refinement")),
    ({"sampler_preset": "confidence-threshold", "sampler": "confidence-threshold", "threshold": 0.8},
     dataclasses.replace(sampler_preset("confidence-threshold"), threshold=0.8)),
    ({"sampler_preset": "discrete-ddim", "corrector_steps": 1},
     dataclasses.replace(sampler_preset("discrete-ddim"), corrector_steps=1)),
    ({"sampler": "block-refinement", "sampler_settings": {"threshold": 0.9}},
     BlockRefinementSamplerConfig(threshold=0.9)),
    ({"sampler_settings": {"entropy_bound": 0.2}}, EntropyBoundSamplerConfig(entropy_bound=0.2)),
])
def test_request_picks_the_sampler(body, expected):
    assert request_settings(body, BASE).config.sampler_config == expected


def test_settings_alone_adjust_the_servers_sampler():
    model_config = DiffusionGemmaGenerationConfig(sampler_config=BlockRefinementSamplerConfig(editing_threshold=0.5))
    got = request_settings({"threshold": 0.7}, model_config).config.sampler_config
    assert got == BlockRefinementSamplerConfig(threshold=0.7, editing_threshold=0.5)


@pytest.mark.parametrize("body,field", [
    ({"sampler": "nope"}, "sampler"),
    ({"sampler": 3}, "sampler"),
    ({"sampler": "block-refinement", "threshold": 2.0}, "threshold"),
    ({"sampler": "block-refinement", "threshold": "high"}, "threshold"),
    ({"sampler": "block-refinement", "corrector_k": 2}, "corrector_k"),
    ({"sampler": "discrete-ddim", "entropy_bound": 0.2}, "entropy_bound"),
    ({"threshold": 0.5}, "threshold"),  # the server's sampler is entropy-bound
    ({"sampler": "discrete-ddim", "corrector_selection": "best"}, "corrector_selection"),
    ({"sampler": "confidence-threshold", "factor": float("inf")}, "factor"),
    ({"sampler_preset": "fastest"}, "sampler_preset"),
    ({"sampler_preset": 1}, "sampler_preset"),
    ({"sampler_preset": "discrete-ddim", "sampler": "block-refinement"}, "sampler"),
    ({"sampler_preset": "discrete-ddim", "threshold": 0.5}, "threshold"),
    ({"sampler": "block-refinement", "sampler_settings": {"threshold": 2.0}}, "sampler_settings.threshold"),
    ({"sampler": "block-refinement", "sampler_settings": {"factor": 0.5}}, "sampler_settings.factor"),
    ({"sampler": "block-refinement", "threshold": 0.5, "sampler_settings": {"threshold": 0.6}},
     "sampler_settings.threshold"),
    ({"sampler_settings": "fast"}, "sampler_settings"),
    ({"sampler": "discrete-ddim", "corrector_steps": 10**12}, "corrector_steps"),
    ({"sampler": "discrete-ddim", "corrector_steps": 4, "max_denoising_steps": 5}, "corrector_steps"),
    ({"sampler": "discrete-ddim", "corrector_steps": 47}, "corrector_steps"),  # the default budget is 48
])
def test_bad_sampler_fields_name_the_field(body, field):
    with pytest.raises(BadRequestField) as error:
        request_settings(body, BASE)
    assert error.value.field == field and f"`{field}`" in str(error.value)


def test_every_sampler_setting_is_an_accepted_body_field():
    declared = set(DiffusionSettingFields.__annotations__)
    assert {"sampler", "sampler_preset", "sampler_settings", "stopper_settings", *SAMPLER_FIELDS} <= declared


@pytest.mark.parametrize("body,config", [
    ({"sampler": "block-refinement", "threshold": 0.6}, BlockRefinementSamplerConfig(threshold=0.6)),
    ({"sampler": "discrete-ddim", "corrector_steps": 1}, DiscreteDDIMSamplerConfig(corrector_steps=1)),
])
def test_a_served_request_equals_generate_alone(body, config):
    model = tiny_model()
    prompt = torch.arange(3, 10)
    settings = request_settings({"max_tokens": 32, "seed": 3, "max_denoising_steps": 6, **body}, BASE)
    scheduler = ServingScheduler(model, max_batch_size=2, max_queue=4, max_model_len=256)
    try:
        rec = JobRecorder()
        scheduler.submit(Job(prompt, settings, rec))
        assert rec.done.wait(60) and rec.error is None, rec.error
        got = torch.cat(rec.canvases[1:])
    finally:
        scheduler.shutdown()
    expected = model.generate(prompt[None], sampler_config=config, seed=3, max_new_tokens=32, max_denoising_steps=6,
                              eos_token_id=None, pad_token_id=0).sequences[0, len(prompt):]
    assert torch.equal(got, expected)


def test_http_sampler_request_and_400(tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from serve_checkpoint import write_checkpoint

    from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app

    path = write_checkpoint(tmp_path)
    served = build_app(ServeOptions(model=path, max_model_len=256, max_batch_size=2, max_queue=4))
    server = BackgroundServer(served.app).start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
        extra = {"sampler": "confidence-threshold", "threshold": 0.5}
        reply = client.completions.create(model=path, prompt="abc", max_tokens=16, seed=2, extra_body=extra)
        ids = served.tokenizer("abc", return_tensors="pt")["input_ids"]
        new = served.model.generate(ids, sampler_config=ConfidenceThresholdSamplerConfig(threshold=0.5), seed=2,
                                    max_new_tokens=16).sequences[0, ids.shape[1]:].tolist()[:16]
        new = new[: new.index(1) + 1] if 1 in new else new
        assert reply.choices[0].text == served.tokenizer.decode(new, skip_special_tokens=True)
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=path, prompt="abc", max_tokens=16,
                                      extra_body={"sampler": "discrete-ddim", "corrector_k": 0})
        assert "`corrector_k`" in error.value.message and error.value.body["param"] == "corrector_k"
    finally:
        server.stop()
        served.state.shutdown()
