"""`parse_tool_calls`: an answer in Gemma 4's call syntax (tool_syntax.py) -> its text and its calls, each call's
arguments checked against its function's `parameters` with `jsonschema`.

A call is returned in `tool_calls` only when it is whole (`<|tool_call>` ... `<tool_call|>`), names a known (and, with
`tool_choice`, allowed) function, and its arguments validate. Anything else in call syntax goes to `invalid` with the
reason, or to `unfinished` when the answer ends inside a call (its budget ran out): never to `tool_calls`.
"""

import json
import re
from dataclasses import dataclass, field

from .tool_syntax import CALL_CLOSE, CALL_OPEN, CALL_PREFIX, KEY, NUMBER, QUOTE
from .tools import check_tools, chosen_names

KEY_RE, NUMBER_RE = re.compile(KEY), re.compile(NUMBER)
WORDS = {"true": True, "false": False, "null": None}


class Unfinished(Exception):
    """The text ended inside a value."""


class Malformed(Exception):
    """The text is not in call syntax here."""


@dataclass
class ParsedReply:
    """Attributes:
        content: the text outside calls (leading and trailing whitespace kept).
        tool_calls: the valid calls, `{"type": "function", "function": {"name", "arguments": JSON string}}`.
        invalid: `{"text", "reason"}` for each call that is malformed, names an unknown function or fails its
            schema.
        unfinished: the text of a call the answer ended inside, or None.
    """

    content: str
    tool_calls: list = field(default_factory=list)
    invalid: list = field(default_factory=list)
    unfinished: str | None = None


def read_value(text: str, i: int):
    """(the value starting at text[i], the index after it)."""
    if i >= len(text):
        raise Unfinished
    if text.startswith(QUOTE, i):
        end = text.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise Unfinished
        return text[i + len(QUOTE) : end], end + len(QUOTE)
    if QUOTE.startswith(text[i:]):
        raise Unfinished
    c = text[i]
    if c == "{":
        return read_object(text, i + 1)
    if c == "[":
        items, i = [], i + 1
        if text[i : i + 1] == "]":
            return items, i + 1
        while True:
            value, i = read_value(text, i)
            items.append(value)
            if i >= len(text):
                raise Unfinished
            if text[i] == "]":
                return items, i + 1
            if text[i] != ",":
                raise Malformed(f"expected ',' or ']' at {i}")
            i += 1
    for word, value in WORDS.items():
        if text.startswith(word, i):
            return value, i + len(word)
        if word.startswith(text[i:]):
            raise Unfinished
    match = NUMBER_RE.match(text, i)
    if match and match.end() > i:
        if match.end() == len(text):
            raise Unfinished  # more digits may follow
        return json.loads(match.group()), match.end()
    if text[i:] == "-":
        raise Unfinished
    raise Malformed(f"no value at {i}: {text[i:i + 20]!r}")


def read_object(text: str, i: int):
    """The object whose `{` ends at i -> (dict, index after `}`). Keys are bare (or in `<|"|>`)."""
    out = {}
    if text[i : i + 1] == "}":
        return out, i + 1
    while True:
        if text.startswith(QUOTE, i):
            key, i = read_value(text, i)
        else:
            match = KEY_RE.match(text, i)
            if not match:
                raise Unfinished if i >= len(text) else Malformed(f"expected a key at {i}")
            key, i = match.group(), match.end()
        if i >= len(text):
            raise Unfinished
        if text[i] != ":":
            raise Malformed(f"expected ':' after key {key!r}")
        value, i = read_value(text, i + 1)
        out[key] = value  # a repeated key: the last one counts, as in JSON parsers
        if i >= len(text):
            raise Unfinished
        if text[i] == "}":
            return out, i + 1
        if text[i] != ",":
            raise Malformed(f"expected ',' or '}}' at {i}")
        i += 1


def read_call(text: str, i: int) -> tuple[str, dict, int]:
    """The call whose `<|tool_call>` ends at i -> (name, arguments, index after `<tool_call|>`)."""
    if not text.startswith(CALL_PREFIX, i):
        if CALL_PREFIX.startswith(text[i:]):
            raise Unfinished
        raise Malformed(f"expected {CALL_PREFIX!r} after {CALL_OPEN!r}")
    match = KEY_RE.match(text, i + len(CALL_PREFIX))
    if not match:
        raise Unfinished if i + len(CALL_PREFIX) >= len(text) else Malformed("no function name")
    if match.end() >= len(text):
        raise Unfinished  # the name may go on
    name, i = match.group(), match.end()
    if text[i] != "{":
        raise Malformed(f"expected '{{' after the name {name!r}")
    arguments, i = read_object(text, i + 1)
    if not text.startswith(CALL_CLOSE, i):
        if CALL_CLOSE.startswith(text[i:]):
            raise Unfinished
        raise Malformed(f"expected {CALL_CLOSE!r} after the arguments")
    return name, arguments, i + len(CALL_CLOSE)


def parse_tool_calls(text: str, tools, tool_choice="auto") -> ParsedReply:
    """Split an answer into its text and its calls (see the module doc).

    Args:
        text: the answer, decoded with its special tokens (`<|tool_call>` ...), without EOS or padding.
        tools: the OpenAI tools the answer may call.
        tool_choice: with a named function, a call of any other one is invalid.

    Returns:
        ParsedReply(content, tool_calls, invalid, unfinished).
    """
    import jsonschema  # the safety net behind the regex: every returned call's arguments validate

    functions = {f["name"]: f for f in check_tools(tools)}
    mode, allowed = chosen_names(list(functions.values()), tool_choice)
    validators = {name: jsonschema.Draft202012Validator(f["parameters"]) for name, f in functions.items()}
    reply, content, i = ParsedReply(content=""), [], 0
    while True:
        start = text.find(CALL_OPEN, i)
        if start < 0:
            content.append(text[i:])
            break
        content.append(text[i:start])
        body = start + len(CALL_OPEN)
        try:
            name, arguments, i = read_call(text, body)
        except Unfinished:
            reply.unfinished = text[start:]
            break
        except Malformed as error:
            close = text.find(CALL_CLOSE, body)
            i = len(text) if close < 0 else close + len(CALL_CLOSE)
            reply.invalid.append({"text": text[start:i], "reason": f"not in call syntax: {error}"})
            continue
        whole = text[start:i]
        if name not in functions or (mode != "none" and name not in allowed):
            reply.invalid.append({"text": whole, "reason": f"calls {name!r}, which is not an allowed tool"})
            continue
        problem = next(iter(validators[name].iter_errors(arguments)), None)
        if problem is not None:
            reply.invalid.append({"text": whole, "reason": f"arguments of {name!r} do not validate: "
                                                           f"{problem.message}"})
            continue
        reply.tool_calls.append({"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}})
    reply.content = "".join(content)
    return reply


def tool_calls_problem(text: str, constraint) -> str | None:
    """Why a complete `ToolCalls` answer is not what its mode promises (answer_check.py's last check), or None."""
    reply = parse_tool_calls(text, constraint.tools, constraint.tool_choice)
    if reply.invalid:
        return f"the answer holds an invalid call ({reply.invalid[0]['reason']})"
    if reply.unfinished is not None:
        return "the answer ends inside a call"
    if constraint.mode == "required" and not reply.tool_calls:
        return "the answer holds no call"
    if constraint.mode == "none" and reply.tool_calls:
        return "the answer holds a call"
    return None
