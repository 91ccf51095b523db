"""`ToolCalls` and `parse_tool_calls` (constraints/tools.py, tool_syntax.py, tool_parse.py): on a random tiny model,
over many seeds, every "required" and named answer parses into calls whose arguments validate (bounds, enums, nested
objects); the template's own rendering of a call parses back; bad tools are refused naming the field."""

import json
import re

import jsonschema
import pytest
import torch

from conftest import tiny_model
from tool_builders import TOOLS, tool_tokenizer

from diffusiongemma import ToolCalls, parse_tool_calls
from diffusiongemma.constraints import ToolsError

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = tool_tokenizer()
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
KW = dict(max_denoising_steps=4, eos_token_id=1, pad_token_id=0, sampling="fast")


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def answers(out, width: int) -> list[str]:
    """The generated text with the markers kept, EOS and padding dropped."""
    return [TOK.decode([t for t in row[width:].tolist() if t not in (0, 1)]) for row in out.sequences]


def valid_calls(text: str, choice="required", names=None) -> list[dict]:
    reply = parse_tool_calls(text, TOOLS, choice)
    assert not reply.invalid and reply.unfinished is None, (text, reply)
    for call in reply.tool_calls:
        name = call["function"]["name"]
        assert names is None or name in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
    return reply.tool_calls


@pytest.mark.parametrize("choice, names", [
    ("required", None), ({"type": "function", "function": {"name": "book"}}, {"book"}),
    ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})], ids=["required", "book", "weather"])
def test_required_and_named_calls_always_validate(model, choice, names):
    constraint, seen = ToolCalls(TOOLS, tool_choice=choice), set()
    for seed in range(6):
        ids = torch.randint(4, 99, (4, 6), generator=torch.Generator().manual_seed(seed))
        out = model.generate(ids, constraint=constraint, tokenizer=TOK, max_new_tokens=64, seed=seed, **KW)
        assert not bool(out.truncated.any()) and not any(out.truncation_reasons)  # answer_check.py agrees
        for text in answers(out, 6):
            assert text.startswith("<|tool_call>call:"), text
            calls = valid_calls(text, choice, names)
            assert calls and text.endswith("<tool_call|>")
            seen.update(c["function"]["name"] for c in calls)
    assert names is None or seen == names


def test_one_call_without_parallel_calls_and_auto_text(model):
    one = ToolCalls(TOOLS, parallel_tool_calls=False)
    auto = ToolCalls(TOOLS, tool_choice="auto")
    for seed in range(3):
        ids = torch.randint(4, 99, (4, 6), generator=torch.Generator().manual_seed(seed))
        for text in answers(model.generate(ids, constraint=one, tokenizer=TOK, max_new_tokens=96, seed=seed, **KW),
                            6):
            assert len(valid_calls(text)) == 1 and text.count("<|tool_call>") == 1
        for text in answers(model.generate(ids, constraint=auto, tokenizer=TOK, max_new_tokens=64, seed=seed, **KW),
                            6):
            reply = parse_tool_calls(text, TOOLS)  # text, then (maybe) calls: never an invalid one
            assert not reply.invalid and reply.unfinished is None, text
            assert "<|" not in reply.content


@pytest.mark.parametrize("choice, parallel, accepted", [
    ("required", True, [False, True, True, False]), ("auto", True, [True, True, True, True]),
    ("auto", False, [False, True, True, True]), ("none", True, [False, False, False, True]),
    ({"type": "function", "function": {"name": "ping"}}, True, [False, False, True, False])])
def test_the_automaton_accepts_exactly_the_mode(choice, parallel, accepted):
    """Text then calls (auto), calls only (required / named), text only (none); one call without parallel calls.
    (Guards against outlines-core's automaton dropping a branch of an ambiguous regex: see tool_syntax.TEXT.)"""
    from diffusiongemma.constraints import compile_constraint

    weather = '<|tool_call>call:get_weather{city:<|"|>Pa ris<|"|>,days:3}<tool_call|>'
    ping = "<|tool_call>call:ping{}<tool_call|>"
    texts = ["Let me see <" + weather + ping, weather, ping, "a < b, no call"]
    automaton = compile_constraint(ToolCalls(TOOLS, choice, parallel), TOK, 128, [1], 0)
    for text, expected in zip(texts, accepted):
        ids = torch.tensor([TOK(text, add_special_tokens=False)["input_ids"]])
        assert bool(automaton.complete(automaton.walk(torch.tensor([automaton.initial]), ids))[0]) == expected, text


def test_template_rendering_parses_back():
    """A call the chat template writes (history) is what the constraint allows and the parser reads."""
    args = {"party": {"size": 3, "names": ["Al", "Bo"]}, "time": 19.5, "vegan": False}
    rendered = TOK.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "book", "arguments": args}}]}], tokenize=False)
    call = re.search(r"<\|tool_call>.*?<tool_call\|>", rendered).group()
    assert re.fullmatch(ToolCalls(TOOLS).to_regex(), call)
    reply = parse_tool_calls("Sure. " + call, TOOLS)
    assert reply.content == "Sure. " and json.loads(reply.tool_calls[0]["function"]["arguments"]) == args


def test_parse_reports_invalid_and_unfinished_calls():
    bad_args = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:99}<tool_call|>'
    unknown = "<|tool_call>call:fly{}<tool_call|>"
    malformed = "<|tool_call>call:ping(x)<tool_call|>"
    good = "<|tool_call>call:ping{}<tool_call|>"
    reply = parse_tool_calls(bad_args + unknown + malformed + good, TOOLS)
    assert [c["function"]["name"] for c in reply.tool_calls] == ["ping"]
    reasons = [i["reason"] for i in reply.invalid]
    assert "do not validate" in reasons[0] and "not an allowed tool" in reasons[1] and "call syntax" in reasons[2]
    cut = parse_tool_calls('Hm <|tool_call>call:get_weather{city:<|"|>Pa', TOOLS)
    assert cut.unfinished.startswith("<|tool_call>") and not cut.tool_calls and cut.content == "Hm "
    named = parse_tool_calls(good, TOOLS, {"type": "function", "function": {"name": "book"}})
    assert not named.tool_calls and "not an allowed tool" in named.invalid[0]["reason"]


@pytest.mark.parametrize("tools, choice, field, message", [
    ([], "required", "tools", "non-empty list"),
    ([{"type": "function", "function": {"name": "bad name"}}], "required", "tools[0].function.name", "identifier"),
    ([{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {
        "x": {"type": "integer", "multipleOf": 3}}}}}], "required", "tools[0].function.parameters", "multipleOf"),
    ([{"type": "function", "function": {"name": "a", "parameters": {"type": "array"}}}], "required",
     "tools[0].function.parameters", "of type \"object\""),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name", "names no tool"),
    (TOOLS, "sometimes", "tool_choice", "must be one of"),
    ([{"function": {"name": "a"}}], "auto", "tools[0]", "must be"),
])
def test_bad_tools_are_refused_naming_the_field(tools, choice, field, message):
    with pytest.raises(ToolsError, match=message) as error:
        ToolCalls(tools, tool_choice=choice)
    assert error.value.field == field


def test_property_names_must_be_identifiers():
    tools = [{"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "properties": {"two words": {"type": "string"}}}}}]
    with pytest.raises(Exception, match="must be an identifier"):
        ToolCalls(tools).to_regex()


def test_pydantic_parameters(model):
    """A pydantic v2 model's schema ($defs, Optional, Literal, conint, constr(pattern=...)) as a tool's parameters."""
    from typing import Literal, Optional

    from pydantic import BaseModel, conint, constr

    class Pet(BaseModel):
        kind: Literal["cat", "dog"]
        age: conint(ge=0, le=30)

    class Adopt(BaseModel):
        name: constr(pattern=r"^[A-Z][a-z]{1,6}$")
        pet: Pet
        note: Optional[str] = None

    tools = [{"type": "function", "function": {"name": "adopt", "parameters": Adopt.model_json_schema()}}]
    constraint = ToolCalls(tools)
    call = '<|tool_call>call:adopt{name:<|"|>Rex<|"|>,pet:{kind:<|"|>dog<|"|>,age:3},note:null}<tool_call|>'
    assert re.fullmatch(constraint.to_regex(), call)
    assert not re.fullmatch(constraint.to_regex(), call.replace("age:3", "age:31"))
    ids = torch.randint(4, 99, (4, 6), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids, constraint=constraint, tokenizer=TOK, max_new_tokens=64, seed=0, **KW)
    for text in answers(out, 6):
        reply = parse_tool_calls(text, tools)
        assert reply.tool_calls and not reply.invalid and reply.unfinished is None, text
        Adopt.model_validate_json(reply.tool_calls[0]["function"]["arguments"])


def test_the_last_check_of_an_answer():
    """answer_check.py's check of a ToolCalls answer: the calls its mode promises, each valid."""
    from diffusiongemma.constraints.tool_parse import tool_calls_problem

    good = '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:2}<tool_call|>'
    assert tool_calls_problem(good, ToolCalls(TOOLS)) is None
    assert "invalid call" in tool_calls_problem(good.replace("days:2", "days:0"), ToolCalls(TOOLS))
    assert "ends inside a call" in tool_calls_problem(good[:-3], ToolCalls(TOOLS))
    assert "no call" in tool_calls_problem("just text", ToolCalls(TOOLS))
    assert "holds a call" in tool_calls_problem(good, ToolCalls(TOOLS, tool_choice="none"))
