"""OpenAI `tools` in `diffusiongemma serve` (serving/tools.py) with the official client, on a random tiny model whose
tokenizer's chat template renders tools like Gemma 4's: "required" and named calls always validate, streamed and
not; the whole tool loop (call, `role: "tool"` result, answer); "length" with no call when the budget ends first;
bad input is a 400 naming the field."""

import json

import jsonschema
import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from conftest import tiny_model, write_generation_config  # noqa: E402
from tool_builders import TOOLS, tool_tokenizer  # noqa: E402

from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tool_ckpt")
    tiny_model().save_pretrained(path)
    tool_tokenizer().save_pretrained(path)
    write_generation_config(path, eos_token_id=1, pad_token_id=0, max_new_tokens=64, max_denoising_steps=4)
    served = build_app(ServeOptions(model=str(path), max_model_len=1024, max_batch_size=4, max_queue=16))
    server = BackgroundServer(served.app).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    yield client, client.models.list().data[0].id, server.url
    server.stop()
    served.state.shutdown()
    torch.set_num_threads(threads)


def check_calls(calls, names=None) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("choice, names", [("required", None), ({"type": "function", "function": {"name": "book"}},
                                                                  {"book"})], ids=["required", "named"])
def test_calls_validate_streamed_and_not(live, choice, names):
    client, model, _ = live
    for seed in range(3):
        reply = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice, seed=seed,
                                               max_tokens=64)
        assert reply.choices[0].finish_reason == "tool_calls"
        check_calls(reply.choices[0].message.tool_calls, names)
    calls, finish, deltas = {}, None, []
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice, seed=7,
                                                max_tokens=64, stream=True):
        for choice_ in chunk.choices:
            finish = choice_.finish_reason or finish
            for delta in choice_.delta.tool_calls or []:  # OpenAI's deltas: index, then id/name, argument pieces
                deltas.append(delta)
                call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == list(range(len(calls)))
    firsts = [d for d in deltas if d.id is not None]
    assert len(firsts) == len(calls) and all(d.function.name and d.function.arguments == "" for d in firsts)
    assert all(d.function.name is None and d.function.arguments for d in deltas if d.id is None)
    for call in calls.values():
        assert call["id"] and (names is None or call["name"] in names)
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_the_whole_tool_loop(live):
    """Call, the tool's result as a `role: "tool"` message, then the answer."""
    client, model, _ = live
    messages = list(ASK)
    reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, seed=1, max_tokens=64,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = reply.choices[0].message
    check_calls(message.tool_calls, {"get_weather"})
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    answer = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none", seed=2,
                                            max_tokens=24)
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason in ("stop", "length") and "<|" not in (answer.choices[0].message.content
                                                                               or "")
    auto = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, seed=3, max_tokens=64)
    if auto.choices[0].message.tool_calls:  # "auto": text, or calls that validate
        check_calls(auto.choices[0].message.tool_calls)


def test_budget_ran_out_is_length_without_a_call(live):
    client, model, _ = live
    reply = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required", seed=0,
                                           max_tokens=8)
    assert reply.choices[0].finish_reason == "length" and not reply.choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                                 seed=0, max_tokens=8, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


BAD_NAME = [{"type": "function", "function": {"name": "get weather", "parameters": {"type": "object"}}}]
BAD_SCHEMA = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "array", "uniqueItems": True}}}}}]


@pytest.mark.parametrize("kwargs, field, message", [
    (dict(tool_choice={"type": "function", "function": {"name": "fly"}}, tools=TOOLS), "tool_choice.function.name",
     "names no tool"),
    (dict(tool_choice="required"), "tool_choice", "needs `tools`"),
    (dict(tools=BAD_NAME), "tools[0].function.name", "must be an identifier"),
    (dict(tools=BAD_SCHEMA), "tools[0].function.parameters", "'uniqueItems'"),
    (dict(tools=TOOLS, response_format={"type": "json_object"}), "response_format", "cannot be combined with"),
    (dict(tools=TOOLS, messages=ASK + [{"role": "tool", "tool_call_id": "nope", "content": "x"}]),
     "messages[1].tool_call_id", "must name an earlier"),
    (dict(tools=TOOLS, messages=ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "ping", "arguments": "{not json"}}]}]),
     "messages[1].tool_calls[0].function.arguments", "not valid JSON"),
])
def test_bad_tools_are_400_naming_the_field(live, kwargs, field, message):
    client, model, _ = live
    kwargs.setdefault("messages", ASK)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, max_tokens=16, **kwargs)
    error = caught.value.body
    assert error["param"] == field and message in error["message"], error


def test_chat_cli_with_tools(live, tmp_path, capsys, monkeypatch):
    """`diffusiongemma chat --tools FILE`: calls are shown; the next typed line goes back as the call's result."""
    import io

    from diffusiongemma.cli import main

    _, _, url = live
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS))
    assert main(["chat", "--url", url, "--tools", str(path), "--tool-choice", "book", "--prompt", "a table",
                 "--no-drafts", "--seed", "1", "--max-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert out.count("[tool call] book {") >= 1
    monkeypatch.setattr("sys.stdin", io.StringIO("weather?\nsunny\n"))
    assert main(["chat", "--url", url, "--tools", str(path), "--tool-choice", "get_weather", "--no-drafts",
                 "--seed", "1", "--max-tokens", "64"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("[tool call] get_weather {") >= 2 and "[result of get_weather]" in captured.err


@pytest.mark.parametrize("content, extra, message", [
    (None, [], "cannot read it"), ("{bad", [], "not valid JSON"), ("[]", [], "non-empty list"),
    (json.dumps(TOOLS), ["--tool-choice", "fly"], "--tool-choice 'fly' names no tool")])
def test_chat_cli_refuses_bad_tools(tmp_path, capsys, content, extra, message):
    from diffusiongemma.cli import main

    path = tmp_path / "tools.json"
    if content is not None:
        path.write_text(content)
    assert main(["chat", "--url", "http://127.0.0.1:9", "--tools", str(path), "--prompt", "hi", *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_template_without_tools_is_refused():
    """The model must see the tools: a chat template that never renders them is a 400 naming `tools`."""
    from conftest import tiny_tokenizer

    from diffusiongemma.serving.settings import BadRequestField
    from diffusiongemma.serving.tools import ToolCallReader

    reader = ToolCallReader(None, [])
    with pytest.raises(BadRequestField, match="does not render tools") as caught:
        reader.bind(tiny_tokenizer(), None)
    assert caught.value.field == "tools"
