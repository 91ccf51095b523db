"""serving/settings.py: request bodies -> RequestSettings, every bad value named; serving/streamer.py: what a request's
stream carries (max_tokens, EOS, stop strings held back across canvases, drafts)."""

import asyncio
import logging

import pytest
import torch
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

from conftest import tiny_tokenizer

from diffusiongemma import DiffusionGemmaGenerationConfig
from diffusiongemma.serving import settings as settings_module
from diffusiongemma.serving.settings import BadRequestField, check_length, request_settings
from diffusiongemma.serving.streamer import DraftText, RowStreamer

MODEL_CONFIG = DiffusionGemmaGenerationConfig(max_new_tokens=64, max_denoising_steps=12, eos_token_id=1,
                                              pad_token_id=0)


def test_defaults_come_from_the_model_then_the_global_defaults():
    s = request_settings({"messages": []}, MODEL_CONFIG)
    assert (s.max_new_tokens, s.config.max_denoising_steps, s.config.t_min, s.config.t_max) == (64, 12, 0.4, 0.8)
    assert (s.sampling, s.seed, s.stop, s.stream_drafts) == ("fast", None, [], False)
    assert s.config.sampler_config.entropy_bound == 0.1 and s.eos_token_id == 1


def test_every_field_lands():
    body = {"max_tokens": 20, "seed": 7, "stop": "##", "max_denoising_steps": 5, "entropy_bound": 1, "t_min": 0,
            "t_max": 2, "stability_threshold": 0, "confidence_threshold": 1, "sampling": "reference",
            "stream_drafts": True, "stream": True}
    s = request_settings(body, MODEL_CONFIG)
    c = s.config
    assert (s.max_new_tokens, c.max_new_tokens, s.seed, s.stop, s.sampling, s.stream_drafts) == (
        20, 20, 7, ["##"], "reference", True)
    # JSON integers are accepted where the config wants floats (1 -> 1.0)
    assert (c.max_denoising_steps, c.t_min, c.t_max, c.stability_threshold) == (5, 0.0, 2.0, 0)
    assert isinstance(c.confidence_threshold, float) and isinstance(c.sampler_config.entropy_bound, float)
    assert request_settings({"max_completion_tokens": 9, "max_tokens": 3}, MODEL_CONFIG).max_new_tokens == 9


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 0), ("max_tokens", 2.5), ("max_denoising_steps", True), ("entropy_bound", 0), ("t_min", -1),
    ("t_max", float("nan")), ("stability_threshold", -1), ("confidence_threshold", "high"), ("sampling", "greedy"),
    ("stream_drafts", 1), ("seed", 2**32), ("stop", ""), ("stop", [1]), ("temperature", "hot"),
])
def test_a_bad_value_names_its_field(field, value):
    with pytest.raises(BadRequestField) as error:
        request_settings({field: value}, MODEL_CONFIG)
    assert error.value.field == field and f"`{field}`" in str(error.value)


def test_t_max_must_exceed_t_min_and_the_length_must_fit():
    with pytest.raises(BadRequestField, match="`t_max`"):
        request_settings({"t_max": 0.3}, MODEL_CONFIG)
    with pytest.raises(BadRequestField, match="`t_min`"):
        request_settings({"t_min": 0.9}, MODEL_CONFIG)
    s = request_settings({"max_tokens": 33}, MODEL_CONFIG)  # 3 canvases of 16
    check_length(s, 10, 16, 58)  # 10 + 48 fits exactly
    with pytest.raises(BadRequestField, match="`max_tokens`.*--max-model-len"):
        check_length(s, 11, 16, 58)


def test_temperature_and_top_p_are_reported_unused_once():
    logging.Logger.warning_once.cache_clear()  # transformers' once-per-process cache: earlier tests may have warned
    logger = hf_logging.get_logger(settings_module.__name__)
    with CaptureLogger(logger) as captured:
        request_settings({"temperature": 0.7, "top_p": 0.9}, MODEL_CONFIG)
        request_settings({"temperature": 0.7}, MODEL_CONFIG)
    assert captured.out.count("`temperature` is not used") == 1 and captured.out.count("`top_p` is not used") == 1


def collect(settings, calls) -> list:
    """Drive a RowStreamer with `calls` [(method, ids)] and return what reached its queue."""
    loop = asyncio.new_event_loop()
    queue = asyncio.Queue()
    streamer = RowStreamer(tiny_tokenizer(), loop, queue, settings)
    streamer.put(torch.tensor([[5, 6]]))  # the prompt: skipped
    for method, ids in calls:
        getattr(streamer, method)(torch.tensor([ids]))
    streamer.end()
    loop.run_until_complete(asyncio.sleep(0))
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    loop.close()
    return items, streamer


def ids(text: str) -> list[int]:
    return tiny_tokenizer()(text)["input_ids"]


def test_stream_truncates_at_max_tokens_and_eos():
    items, streamer = collect(request_settings({"max_tokens": 6}, MODEL_CONFIG), [("put", ids("abcd")),
                                                                                  ("put", ids("efgh"))])
    assert "".join(items[:-1]) == "abcdef" and items[-1] is None and streamer.abandoned
    items, streamer = collect(request_settings({}, MODEL_CONFIG), [("put", ids("ab") + [1] + ids("cd"))])
    assert "".join(items[:-1]) == "ab" and streamer.generated == ids("ab") + [1]


def test_stop_string_split_across_canvases_is_held_back():
    s = request_settings({"stop": ["XYZ"]}, MODEL_CONFIG)
    items, streamer = collect(s, [("put", ids("helloXY")), ("put", ids("Zworld"))])
    assert "".join(items[:-1]) == "hello" and streamer.abandoned
    assert items[0] == "hello"  # "XY" was held back after the first canvas: it could begin the stop string
    items, _ = collect(s, [("put", ids("helloXY")), ("put", ids("ab"))])
    assert "".join(items[:-1]) == "helloXYab"


def test_drafts_only_when_asked_and_numbered_by_canvas_and_step():
    calls = [("put_draft", ids("ab??")), ("put_draft", ids("abcd")), ("put", ids("abcd")), ("put_draft", ids("ef"))]
    items, _ = collect(request_settings({"stream_drafts": True, "stream": True, "max_tokens": 6}, MODEL_CONFIG), calls)
    drafts = [(str(d), d.canvas, d.step) for d in items if isinstance(d, DraftText)]
    assert drafts == [("ab??", 0, 1), ("abcd", 0, 2), ("ef", 1, 1)]  # the last draft cut to the 2 tokens left
    items, _ = collect(request_settings({"max_tokens": 6}, MODEL_CONFIG), calls)
    assert not any(isinstance(d, DraftText) for d in items)


def test_length_errors_name_the_prompt_and_a_capped_max_model_len():
    s = request_settings({"max_tokens": 33, "messages": []}, MODEL_CONFIG)  # 3 canvases of 16
    with pytest.raises(BadRequestField) as error:
        check_length(s, 50, 16, 58, requested_max_model_len=4096)  # the prompt leaves no room for one canvas
    assert error.value.field == "messages" and "shorten the prompt" in str(error.value)
    assert "--max-model-len 4096, capped by the model's max_position_embeddings" in str(error.value)
    with pytest.raises(BadRequestField) as error:
        check_length(s, 20, 16, 58, requested_max_model_len=58)
    assert error.value.field == "max_tokens" and "at most 32 new tokens fit" in str(error.value)
    assert "--max-model-len (58)" in str(error.value)
    with pytest.raises(BadRequestField, match="`prompt`: the prompt is empty"):
        check_length(request_settings({"prompt": ""}, MODEL_CONFIG), 0, 16, 58)
    huge = request_settings({"max_tokens": 2**31 - 1}, MODEL_CONFIG)  # integer arithmetic: no float overflow
    with pytest.raises(BadRequestField, match="`max_tokens`"):
        check_length(huge, 5, 16, 58)


@pytest.mark.parametrize("field, value, message", [
    ("max_denoising_steps", 1025, "at most 1024 per request"), ("max_denoising_steps", 2**31, "at most 100000"),
    ("stability_threshold", 2**62, "at most 100000"), ("max_tokens", 10**400, "at most 2147483647"),
    ("seed", 2**63, "CPU generator keeps 32 bits"), ("sampling", ["fast"], "must be one of"),
])
def test_out_of_range_values_are_refused_at_admission(field, value, message):
    with pytest.raises(BadRequestField, match=message) as error:
        request_settings({field: value}, MODEL_CONFIG)
    assert error.value.field == field


def test_a_server_default_above_the_request_bound_is_named():
    config = DiffusionGemmaGenerationConfig(max_denoising_steps=5000, eos_token_id=1)
    with pytest.raises(BadRequestField, match="model's generation_config"):
        request_settings({}, config)
