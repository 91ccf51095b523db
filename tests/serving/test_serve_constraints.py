"""`diffusiongemma serve` honours `response_format` (json_schema, json_object) and the extra `regex` field: answers
through the official `openai` client validate, concurrently and streamed too, with fast and reference sampling;
a budget that runs out gives finish_reason "length"; a bad constraint is a 400 naming its field."""

import json
import re
import threading
import time
from unittest import mock

import jsonschema
import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_checkpoint import write_checkpoint  # noqa: E402

from diffusiongemma import Regex  # noqa: E402
from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "kind": {"enum": ["town", "village"]},
    "population": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
    "required": ["city", "kind", "population"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    served = build_app(ServeOptions(model=write_checkpoint(tmp_path_factory.mktemp("ckpt")), max_model_len=256,
                                    max_batch_size=4, max_queue=16))
    server = BackgroundServer(served.app).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    yield served, client, client.models.list().data[0].id
    server.stop()
    served.state.shutdown()
    torch.set_num_threads(threads)


def chat(client, model, seed, max_tokens=96, **kwargs):
    extra = kwargs.pop("extra_body", None)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"q{seed}"}],
                                          max_tokens=max_tokens, seed=seed, extra_body=extra, **kwargs)


def test_json_schema_answers_validate_concurrently(live):
    _, client, model = live
    replies = [None] * 6

    def run(i):
        replies[i] = chat(client, model, i, response_format=FORMAT)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for reply in replies:
        jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
        assert reply.choices[0].finish_reason == "stop"


def test_json_object_and_reference_sampling(live):
    _, client, model = live
    reply = chat(client, model, 1, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    reply = chat(client, model, 2, response_format=FORMAT, extra_body={"sampling": "reference"})
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


def test_regex_streamed_and_legacy_completions(live):
    _, client, model = live
    chunks = list(chat(client, model, 3, max_tokens=40, stream=True, extra_body={"regex": r"[0-9]{3}-[a-z]{2,8}"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,8}", text), text
    assert chunks[-1].choices[0].finish_reason == "stop"
    reply = client.completions.create(model=model, prompt="abc", max_tokens=20, seed=4,
                                      extra_body={"regex": r"(yes|no)!"})
    assert reply.choices[0].text in ("yes!", "no!")
    reply = client.completions.create(model=model, prompt="abc", max_tokens=40, seed=4,
                                      extra_body={"response_format": FORMAT})
    jsonschema.validate(json.loads(reply.choices[0].text), SCHEMA)


def test_budget_ran_out_is_length(live):
    _, client, model = live
    reply = chat(client, model, 5, max_tokens=12, response_format=FORMAT)
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("extra, field, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number",
                                                                                         "minimum": 0.5}}}},
     "response_format", "unsupported bound minimum=0.5"),
    ({"response_format": {"type": "yaml"}}, "response_format", "`type` must be one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "with a `schema` object"),
    ({"regex": "("}, "regex", "malformed or unsupported regular expression"),
    ({"regex": "ü+"}, "regex", "cannot spell"),
    ({"regex": 3}, "regex", "must be a string"),
    ({"regex": "a", "response_format": {"type": "json_object"}}, "regex", "not both"),
    ({"regex": "a+", "stop": ["x"]}, "stop", "cannot be combined with `regex`"),
    ({"regex": "a^b"}, "regex", "anchor '^' at offset 1 is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"n": {"$ref": "#"}}}}}}, "response_format", "recursive $ref '#'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "const": 3}}}}, "response_format", "schema.const = 3 contradicts"),
])
def test_bad_constraints_are_400_naming_the_field(live, extra, field, message):
    _, client, model = live
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, model, 0, extra_body=extra)
    error = caught.value.body
    assert error["param"] == field and message in error["message"]


def test_constrained_plans_are_shared_then_forgotten(live):
    from diffusiongemma.constraints import compile_constraint
    from diffusiongemma.serving import scheduler as scheduling
    from diffusiongemma.serving.settings import request_settings

    served, client, model = live
    chat(client, model, 0, max_tokens=16, extra_body={"regex": "[a-z]+"})  # the scheduler starts with a request
    sched = served.scheduler

    def settings(pattern):
        s = request_settings({"max_tokens": 16}, served.model.generation_config)
        s.automaton = compile_constraint(Regex(pattern), served.tokenizer, sched.V, [1], 0)
        return s

    first = sched._plan(settings("a+"))
    assert sched._plan(settings("a+")) is first  # the same constraint and budget: one plan, one call per step
    for i in range(scheduling.MAX_CONSTRAINED_PLANS):
        sched._plan(settings(f"b{{{i + 1}}}"))
    assert sched._plan(settings("a+")) is not first  # the oldest was forgotten
    assert len(sched._constrained) == scheduling.MAX_CONSTRAINED_PLANS


def test_a_slow_schema_is_refused_without_holding_up_the_server(live):
    # compiled in a worker (the event loop keeps answering) within a budget (here 2 s), refused with a 400 naming
    # response_format, and the refusal cached: a retry answers at once
    from diffusiongemma.constraints.budget import CompileBudget

    _, client, model = live
    slow = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "maxLength": 40}}}
    caught = []

    def send():
        with pytest.raises(openai.BadRequestError) as error:
            chat(client, model, 0, response_format=slow)
        caught.append(error.value.body)

    with mock.patch("diffusiongemma.constraints.automaton.DEFAULT_BUDGET", CompileBudget(2, 256 << 20)):
        thread = threading.Thread(target=send)
        thread.start()
        time.sleep(0.3)
        start = time.monotonic()
        client.models.list()  # answered while the schema compiles
        assert time.monotonic() - start < 1.5
        thread.join(timeout=60)
        assert caught[0]["param"] == "response_format" and "exceeds the budget of 2 s" in caught[0]["message"]
        start = time.monotonic()
        send()
        assert time.monotonic() - start < 1.5


def test_an_answer_failing_the_final_check_is_never_a_stop(live):
    # a JSON answer the schema check rejects (the check made to fail here): non-streamed, a 500 naming why;
    # streamed, an error event instead of a finish_reason
    _, client, model = live
    fmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}
    with mock.patch("diffusiongemma.constraints.answer_check.schema_problem", return_value='fails "X"'):
        with pytest.raises(openai.InternalServerError) as caught:
            chat(client, model, 0, max_tokens=16, response_format=fmt)
        assert 'fails "X"' in caught.value.body["message"] and "a bug of diffusiongemma" in caught.value.body["message"]
        with pytest.raises(openai.APIError) as caught:
            list(chat(client, model, 0, max_tokens=16, response_format=fmt, stream=True))
        assert 'fails "X"' in str(caught.value.body)
    reply = chat(client, model, 0, max_tokens=16, response_format=fmt)  # the real check passes
    assert reply.choices[0].finish_reason == "stop" and json.loads(reply.choices[0].message.content) in (True, False)


def test_a_tokenizer_whose_decode_is_not_its_pieces_is_a_400(live):
    served, client, model = live
    backend = served.tokenizer.backend_tokenizer
    decoder, backend.decoder = backend.decoder, None  # transformers now joins the pieces with spaces
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            chat(client, model, 0, extra_body={"regex": "(q|r)[0-9]z"})  # not compiled before
    finally:
        backend.decoder = decoder
    assert caught.value.body["param"] == "regex"
    assert "decode() is not the concatenation of its tokens' text" in caught.value.body["message"]
