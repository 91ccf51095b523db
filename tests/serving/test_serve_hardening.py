"""diffusiongemma serve against hostile requests (issue 29), on a live server on 127.0.0.1: no request hurts another
(bad ranges are refused at admission while a good request runs), unsupported fields and malformed bodies are 400s
naming the field (never a 200 that ignores them, never a bare 500), and the numbers in an answer are right."""

import json
import threading

import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_checkpoint import write_checkpoint  # noqa: E402

from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402
from diffusiongemma.serving.request_checks import UNSUPPORTED  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = write_checkpoint(tmp_path_factory.mktemp("hardening_ckpt"))
    served = build_app(ServeOptions(model=model, max_model_len=256, max_batch_size=4, max_queue=16))
    server = BackgroundServer(served.app).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    yield served, client, model
    server.stop()
    served.state.shutdown()
    torch.set_num_threads(threads)


def post(client, path, body):
    return client.post(path, body=body, cast_to=object)


def refused(client, body, path="/chat/completions"):
    """The 400's OpenAI error object for `body`."""
    with pytest.raises(openai.BadRequestError) as error:
        post(client, path, body)
    return error.value.body


def solo(served, text, seed, max_tokens, **settings):
    ids = served.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)["input_ids"]
    new = served.model.generate(ids, sampling="fast", seed=seed, max_new_tokens=max_tokens, **settings)
    new = new.sequences[0, ids.shape[1]:].tolist()[:max_tokens]
    return new[: new.index(1) + 1] if 1 in new else new


@pytest.mark.parametrize("field, value", [
    ("max_denoising_steps", 2**31), ("max_denoising_steps", 1025), ("stability_threshold", 2**62),
    ("max_tokens", 10**400), ("seed", 2**32), ("seed", 2**63),
])
def test_out_of_range_requests_are_refused_while_a_good_one_runs(live, field, value):
    served, client, model = live
    result = {}

    def good():
        result["reply"] = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "good"}], max_tokens=48, seed=3,
            extra_body={"max_denoising_steps": 12, "confidence_threshold": 1e-9})

    thread = threading.Thread(target=good)
    thread.start()
    body = {"model": model, "messages": MESSAGES, "max_tokens": 16, field: value}
    error = refused(client, body)
    thread.join(timeout=120)
    assert error["param"] == field and f"`{field}`" in error["message"]
    expected = solo(served, "good", 3, 48, max_denoising_steps=12, confidence_threshold=1e-9)
    assert result["reply"].choices[0].message.content == served.tokenizer.decode(expected, skip_special_tokens=True)


def test_a_huge_stability_threshold_within_the_bound_is_cheap(live):
    served, client, model = live
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, seed=1,
                                           extra_body={"stability_threshold": 100_000, "max_denoising_steps": 4})
    # never stable: every canvas runs all its steps; the stopper keeps one canvas of history, not 100000
    assert reply.choices[0].message.content == served.tokenizer.decode(
        solo(served, "hi", 1, 16, stability_threshold=100_000, max_denoising_steps=4), skip_special_tokens=True)


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
def test_every_unsupported_field_is_a_400_naming_it(live, field):
    _, client, model = live
    value = {"n": 2, "best_of": 3, "logprobs": True, "top_logprobs": 2, "echo": True, "tool_choice": "required",
             "presence_penalty": 0.5, "frequency_penalty": -1, "logit_bias": {"5": 10}, "response_format":
             {"type": "json_object"}, "generation_config": {"max_new_tokens": -1}, "audio": {"voice": "x"},
             "modalities": ["text", "audio"], "functions": [{"name": "f"}], "function_call": "none"}.get(field, "x")
    path = "/completions" if field in ("best_of", "echo") else "/chat/completions"
    body = {"model": model, "max_tokens": 16, field: value}
    body.update({"prompt": "abc"} if path == "/completions" else {"messages": MESSAGES})
    error = refused(client, body, path)
    assert error["param"] == field and "not supported" in error["message"]


def test_neutral_values_of_unsupported_fields_are_honoured(live):
    _, client, model = live
    reply = post(client, "/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 16, "n": 1,
                                               "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0,
                                               "logit_bias": {}, "response_format": {"type": "text"}})
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("patch, param", [
    ({"stream": "false"}, "stream"), ({"stream": 1}, "stream"),
    ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"), ({"messages": None}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"), ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]},
     "messages[0].content[0]"),
    ({"sampling": ["fast"]}, "sampling"), ({"sampling": {"a": 1}}, "sampling"),
    ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
])
def test_malformed_chat_bodies_are_400s_never_500s(live, patch, param):
    _, client, model = live
    error = refused(client, {"model": model, "messages": MESSAGES, "max_tokens": 16, **patch})
    assert error["param"] == param


@pytest.mark.parametrize("prompt", ["", None, ["abc"], 5])
def test_malformed_prompts_are_400s(live, prompt):
    _, client, model = live
    body = {"model": model, "max_tokens": 16} | ({"prompt": prompt} if prompt is not None else {})
    assert refused(client, body, "/completions")["param"] == "prompt"


def test_t_min_and_t_max_are_judged_together_and_cite_what_was_sent(live):
    _, client, model = live
    ok = post(client, "/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 16, "seed": 1,
                                            "t_min": 0.9, "t_max": 1.0})  # both sent: valid, whatever the defaults
    assert ok["choices"][0]["finish_reason"] in ("stop", "length")
    error = refused(client, {"model": model, "messages": MESSAGES, "t_max": 0.3})
    assert error["param"] == "t_max" and "t_max=0.3 (sent)" in error["message"]
    assert "t_min=0.4 (this server's default)" in error["message"]


def test_length_errors_blame_the_right_field(live):
    _, client, model = live
    long = [{"role": "user", "content": "x " * 200}]
    error = refused(client, {"model": model, "messages": long, "max_tokens": 16})
    assert error["param"] == "messages" and "shorten the prompt" in error["message"]
    error = refused(client, {"model": model, "messages": MESSAGES, "max_tokens": 250})
    assert error["param"] == "max_tokens" and "new tokens fit after this prompt" in error["message"]


def test_the_model_id_of_a_response_is_accepted_back(live):
    _, client, model = live
    reply = post(client, "/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 16})
    again = post(client, "/chat/completions", {"model": reply["model"], "messages": MESSAGES, "max_tokens": 16})
    assert again["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_in_the_last_canvas_finishes_with_stop(live, stream):
    served, client, model = live
    full = solo(served, "stop test", 4, 16)  # one canvas: the only and last one allowed
    text = served.tokenizer.decode(full, skip_special_tokens=True)
    stop = text[6:8]
    assert 1 not in full[:8] and len(full) == 16 and text.index(stop) == 6
    body = {"model": model, "messages": [{"role": "user", "content": "stop test"}], "max_tokens": 16, "seed": 4,
            "stop": [stop]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        chunks = list(client.chat.completions.create(**body))
        got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = [c.usage for c in chunks if c.usage]
        assert got == text[:6] and finish == ["stop"]
        assert not usage or usage[-1].completion_tokens < 16
    else:
        reply = client.chat.completions.create(**body)
        assert reply.choices[0].message.content == text[:6] and reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens < 16


def test_bodies_are_checked_with_the_exact_json_sent(live):
    """max_tokens of 10**400 arrives as a Python int of 401 digits: a 400, not an OverflowError."""
    _, client, model = live
    import urllib.request

    raw = json.dumps({"model": model, "messages": MESSAGES})[:-1] + ', "max_tokens": 1' + "0" * 400 + "}"
    request = urllib.request.Request(str(client.base_url) + "chat/completions", data=raw.encode(),
                                     headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=60)
    assert error.value.code == 400 and json.loads(error.value.read())["error"]["param"] == "max_tokens"
