"""OpenAI `tools` in chat completions: the request's fields read into a `ToolCalls` constraint, and a reader that
turns the answer's committed text into content and tool calls as it streams.

    {"tools": [...], "tool_choice": "auto" | "none" | "required" | {"type": "function", "function": {"name": N}},
     "parallel_tool_calls": true}

Every mode is denoised under its `ToolCalls` constraint (constraints/tools.py): "required" and a named function
give only calls whose arguments validate; "auto" gives text, then optionally calls, and a call, once started, is
constrained to be whole and valid; "none" gives text that never holds a call marker. The tools reach the prompt
through the tokenizer's chat template (transformers serve passes `tools=` to `apply_chat_template`).

`ToolCallReader` has the interface transformers serve's streamer feeds a response parser through (`feed(text)` ->
events, `finalize()`, `initial_events`), so committed text is read with its special tokens kept and each call is
emitted once whole and valid (transformers serve turns it into one tool-call delta: index, id, name, arguments).
"""

import weakref

from ..constraints import ToolCalls, ToolsError, parse_tool_calls
from ..constraints.tool_syntax import CALL_OPEN
from .settings import BadRequestField

ARGUMENT_PIECE = 32  # characters of a call's JSON arguments per streamed delta


def request_tool_calls(body: dict) -> ToolCalls | None:
    """The `ToolCalls` constraint of a chat request with `tools`, or None without them.

    Raises:
        BadRequestField: malformed tools (naming `tools[i]...`), a bad or unknown `tool_choice`, `tool_choice`
            or `parallel_tool_calls` without tools, a schema the constraint cannot enforce.
    """
    tools, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if tools is None:
        for name, value in (("tool_choice", choice), ("parallel_tool_calls", parallel)):
            if value is not None and value != "none":
                raise BadRequestField(name, f"needs `tools`, got {value!r} without them")
        return None
    try:
        constraint = ToolCalls(tools, tool_choice="auto" if choice is None else choice,
                               parallel_tool_calls=True if parallel is None else parallel)
        constraint.to_regex()  # errors of the argument schemas, named here rather than at compile time
    except ToolsError as error:
        raise BadRequestField(error.field, str(error).split("` ", 1)[-1]) from None
    except ValueError as error:
        raise BadRequestField("tools", str(error)) from None
    return constraint


def check_tool_messages(body: dict) -> None:
    """Assistant `tool_calls` in the history carry JSON-object arguments; a `tool` message answers one of them by
    `tool_call_id`. A 400 names the field otherwise (transformers serve would fail on them with a 500)."""
    import json

    ids = set()
    for i, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        for j, call in enumerate(message.get("tool_calls") or []):
            where = f"messages[{i}].tool_calls[{j}]"
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise BadRequestField(where, f"must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                             f"\"arguments\"}}}}, got {call!r}"[:300])
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError as error:
                    raise BadRequestField(f"{where}.function.arguments", f"is not valid JSON: {error}") from None
            if not isinstance(arguments, dict):
                raise BadRequestField(f"{where}.function.arguments", f"must be a JSON object, got {arguments!r}"[:300])
            ids.add(call.get("id"))
        if message.get("role") == "tool" and message.get("tool_call_id") not in ids:
            raise BadRequestField(f"messages[{i}].tool_call_id", f"must name an earlier assistant tool call's id, "
                                                                 f"got {message.get('tool_call_id')!r}")


class ToolCallReader:
    """Reads one answer's committed text (special tokens kept) into content and tool calls.

    Content is emitted as it arrives, except from the first `<` that may begin a call marker; a call is emitted when
    it is whole (`parse_tool_calls` has validated it). Afterwards `calls`, `invalid` and `unfinished` describe the
    whole answer.

    Args:
        constraint: the request's `ToolCalls`.
        drop: texts that end an answer (EOS, pad) and are not part of it.
    """

    def __init__(self, constraint: ToolCalls, drop: list[str]):
        self.constraint = constraint
        self.drop = [d for d in drop if d]
        self.text = ""  # the answer so far
        self.sent = 0  # characters of content emitted
        self.calls: list[dict] = []
        self.invalid: list[dict] = []
        self.unfinished: str | None = None
        self.initial_events: list = []

    def bind(self, tokenizer, settings) -> None:
        """Read the end texts from the server's tokenizer; refuse a chat template that never shows the model the tools.

        Raises:
            BadRequestField: the template does not use `tools` (the model would call functions it was never shown).
        """
        template = getattr(tokenizer, "chat_template", None) or ""
        if isinstance(template, dict):
            template = " ".join(template.values())
        if "tools" not in template:
            raise BadRequestField("tools", "this model's chat template does not render tools, so the model would "
                                           "never see them; serve it with a template that does (Gemma 4's)")
        self.drop = end_texts(tokenizer, settings)

    def _clean(self, text: str) -> str:
        for d in self.drop:
            text = text.replace(d, "")
        return text

    def feed(self, text: str) -> list[dict]:
        """New committed text -> transformers serve's parser events (content chunks, closed tool calls)."""
        self.text += self._clean(text)
        return self._events(final=False)

    def finalize(self):
        return None, self._events(final=True)

    def _events(self, final: bool) -> list[dict]:
        reply = parse_tool_calls(self.text, self.constraint.tools, self.constraint.tool_choice)
        start = self.text.find(CALL_OPEN)
        if start < 0:  # no call yet: hold back a tail that may begin the marker
            hold = 0 if final else next((k for k in range(len(CALL_OPEN) - 1, 0, -1)
                                         if self.text.endswith(CALL_OPEN[:k])), 0)
            safe = len(self.text) - hold
        else:
            safe = start
        events = []
        if safe > self.sent:
            events.append({"type": "region_chunk", "field": "content", "text": self.text[self.sent:safe]})
            self.sent = safe
        for call in reply.tool_calls[len(self.calls):]:
            events.append({"type": "region_close", "field": "tool_calls", "value": call})
        self.calls, self.invalid = reply.tool_calls, reply.invalid
        self.unfinished = reply.unfinished if final else None
        if final and start >= 0 and len(reply.content) > self.sent:  # text between or after calls
            events.append({"type": "region_chunk", "field": "content", "text": reply.content[self.sent:]})
            self.sent = len(reply.content)
        return events


def end_texts(tokenizer, settings) -> list[str]:
    """The texts of the ids that end an answer (EOS, pad), as a decode that keeps special tokens writes them."""
    eos = settings.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
    pad = settings.config.pad_token_id if settings.config.pad_token_id is not None else tokenizer.pad_token_id
    ids += [pad] if pad is not None else []
    return [tokenizer.convert_ids_to_tokens(int(i)) for i in ids]


def with_tool_calls(settings, body: dict):
    """Put the request's `ToolCalls` (if any) on its settings as its constraint, with a `ToolCallReader`.

    Raises:
        BadRequestField: see `request_tool_calls`; `response_format` / `regex` or `stop` beside calls.
    """
    constraint = request_tool_calls(body)
    if constraint is None or (constraint.mode == "none" and settings.constraint is not None):
        return settings  # "none" beside a response_format: the format constrains the text
    if settings.constraint is not None:
        raise BadRequestField(settings.constraint_field, "cannot be combined with `tools` unless `tool_choice` is "
                                                         "\"none\": the answer is constrained to tool calls")
    if body.get("stop"):
        raise BadRequestField("stop", "cannot be combined with `tools`: an answer cut at a stop string could cut a "
                                      "call")
    settings.constraint, settings.constraint_field, settings.tools = constraint, "tools", ToolCallReader(constraint, [])
    return settings


class ToolsHandlerMixin:
    """The chat handler's tool parts: checks of the history's calls, the non-streaming response with
    `message.tool_calls`, and a streamed `finish_reason` of "length" when the answer ended inside a call."""

    def _validate_request(self, body: dict) -> None:
        super()._validate_request(body)
        check_tool_messages(body)

    def _streaming(self, request_id, model, processor, model_id, inputs, gen_config, gen_manager, tools=None):
        if getattr(gen_config, "tools", None) is not None:  # read back by the last chunk (gone with the request)
            self.__dict__.setdefault("_tool_readers", weakref.WeakValueDictionary())[request_id] = gen_config.tools
        return super()._streaming(request_id, model, processor, model_id, inputs, gen_config,
                                  gen_manager=gen_manager, tools=tools)

    def _build_chunk_sse(self, request_id: str = "", *args, finish_reason=None, tool_calls=None, **kwargs) -> str:
        reader = self.__dict__.get("_tool_readers", {}).pop(request_id, None) if finish_reason else None
        if reader is not None and reader.unfinished is not None:
            finish_reason = "length"  # the budget ended inside a call: no call is complete
        if not tool_calls:
            return super()._build_chunk_sse(request_id, *args, finish_reason=finish_reason, **kwargs)
        # a whole call, streamed as OpenAI streams one: its index, id, type and name with empty arguments, then the
        # arguments in pieces (index and arguments only)
        from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

        events = []
        for call in tool_calls:
            arguments = call.function.arguments or ""
            head = ChoiceDeltaToolCall(index=call.index, id=call.id, type="function",
                                       function={"name": call.function.name, "arguments": ""})
            events.append(super()._build_chunk_sse(request_id, *args, tool_calls=[head], **kwargs))
            for start in range(0, len(arguments), ARGUMENT_PIECE):
                part = arguments[start : start + ARGUMENT_PIECE]
                piece = ChoiceDeltaToolCall(index=call.index, function={"arguments": part})
                events.append(super()._build_chunk_sse(request_id, *args, tool_calls=[piece], **kwargs))
        return "".join(events)

    async def _non_streaming(self, request_id, model, processor, model_id, inputs, gen_config, gen_manager,
                             tools=None):
        reader = getattr(gen_config, "tools", None)
        if reader is None:
            return await super()._non_streaming(request_id, model, processor, model_id, inputs, gen_config,
                                                gen_manager=gen_manager, tools=tools)
        from fastapi.responses import JSONResponse
        from openai.types.chat import ChatCompletionMessageToolCall
        from openai.types.completion_usage import CompletionUsage

        content, prompt_tokens, generated = await gen_manager.generate_non_streaming(
            model, processor, inputs, gen_config, request_id=request_id)
        calls = [ChatCompletionMessageToolCall(id=f"{request_id}_tool_call_{i}", type="function",
                                               function=call["function"]) for i, call in enumerate(reader.calls)]
        budget = gen_config.max_new_tokens
        if reader.unfinished is not None or (not calls and budget is not None and len(generated) >= budget):
            finish = "length"
        else:
            finish = "tool_calls" if calls else "stop"
        usage = CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=len(generated),
                                total_tokens=prompt_tokens + len(generated))
        return JSONResponse(self._build_completion(request_id, content or None, model_id, finish_reason=finish,
                                                   usage=usage, tool_calls=calls or None))
