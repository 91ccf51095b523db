"""transformers serve's chat and legacy-completion handlers, taught block diffusion through their overridable parts:

- `_valid_params_class`: the extra body fields (`max_denoising_steps`, ..., `stream_drafts`) are accepted;
- `_resolve_model`: the id transformers serve puts in its responses (`ID@main`) names the served model too;
- `_validate_request`: also refuses fields this server cannot honour and malformed `messages`/`prompt`/`stream`
  (`request_checks.py`: 400 naming the field);
- `_build_generation_config`: builds and validates our `RequestSettings` (400 naming the bad field);
- `_build_chunk_sse`: a `DraftText` queue item becomes a chunk with an empty delta and the extra `draft` field
  (drafts.py);
- `_non_streaming`: the JSON response waits in a response object that also watches for the client leaving, so a
  non-streaming request is cancelled like a streaming one (transformers serve cancels streams only); with
  `logprobs` asked, the response gets its `choices[0].logprobs` (serving/logprobs.py);
- `_build_chunk_sse`: a `LogprobText` item carries its tokens' `logprobs` into the chunk.

Everything else (templates, SSE framing, usage, finish reasons) is transformers serve's own code; OpenAI `tools` are
read, constrained and parsed in tools.py.
`add_error_handlers` answers a bad field (400) and a full queue (429) in the OpenAI error format.
"""

import asyncio
import json
from typing_extensions import TypedDict  # the base classes are typing_extensions TypedDicts

from fastapi import HTTPException
from fastapi.responses import JSONResponse, Response
from transformers.cli.serving.chat_completion import (
    UNUSED_CHAT_COMPLETION_FIELDS,
    ChatCompletionHandler,
    TransformersCompletionCreateParamsStreaming,
)
from transformers.cli.serving.completion import CompletionHandler, TransformersTextCompletionCreateParams

from .logprobs import LogprobText, chat_logprobs, completion_logprobs, requested_top
from .request_checks import check_chat_body, check_completion_body
from .constraint_fields import compile_off_loop, request_constraint
from .scheduler import QueueFull
from .settings import BadRequestField, request_settings
from .streamer import ConstrainedAnswerError
from .drafts import DraftText, with_draft
from .tools import ToolsHandlerMixin, with_tool_calls


class DiffusionSettingFields(TypedDict, total=False):
    """The diffusion settings a request may carry as extra body fields (validated in settings.py)."""

    max_denoising_steps: int
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int
    confidence_threshold: float
    sampling: str
    stream_drafts: bool
    draft_confidence: bool  # each position's token and confidence in the drafts (drafts.py)
    diffusion_frame: bool  # the drafts also as Unsloth Studio's `diffusion_frame` events
    # `sampler` and the built-in samplers' settings (sampler_request.py; tests check this list is complete)
    sampler: str
    sampler_preset: str  # a named preset (generation/sampler_presets.py)
    sampler_settings: dict  # any sampler's settings in one object, plug-ins included
    stopper: str  # a registered plug-in stopper, or "stable-and-confident" (stopper_request.py)
    stopper_settings: dict  # a plug-in stopper's settings
    threshold: float
    editing_threshold: float
    greedy: bool
    factor: float
    corrector_steps: int
    corrector_k: int
    corrector_selection: str
    corrector_selection_tau: float
    regex: str  # the answer fully matches it (constraint_fields.py)


class DiffusionFields(TransformersCompletionCreateParamsStreaming, DiffusionSettingFields, total=False):
    """Chat request fields: OpenAI's and transformers serve's, plus the diffusion settings."""


class DiffusionTextFields(TransformersTextCompletionCreateParams, DiffusionSettingFields, total=False):
    """Legacy completion request fields plus the diffusion settings (and `response_format`, as for chat)."""

    response_format: dict


def with_logprobs(sse: str, logprobs: dict) -> str:
    """Set `choices[0].logprobs` of one SSE `data: {...}` event."""
    payload = json.loads(sse.removeprefix("data: "))
    payload["choices"][0]["logprobs"] = logprobs
    return f"data: {json.dumps(payload)}\n\n"


class DisconnectAwareResponse(Response):
    """A response computed while the client waits, abandoned (its coroutine cancelled) if the client leaves first.

    Args: make: coroutine function returning the real response.
    """

    def __init__(self, make):
        super().__init__()
        self.make = make

    async def __call__(self, scope, receive, send) -> None:
        async def client_left():
            while (await receive())["type"] != "http.disconnect":
                pass

        work, watch = asyncio.ensure_future(self.make()), asyncio.ensure_future(client_left())
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client left: cancelling `work` frees its row
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            return
        watch.cancel()
        response = work.result()  # raises the handler's HTTPException, if any
        await response(scope, receive, send)


class DiffusionHandlerMixin:
    """The parts both handlers override (see the module docstring)."""

    check_body = None  # the body's shape check of the endpoint (`request_checks.py`)
    chat = True  # which OpenAI shape `logprobs` take

    def _validate_request(self, body: dict) -> None:
        super()._validate_request(body)  # unknown fields: 422
        self.check_body(body)  # unsupported fields, malformed messages/prompt/stream: 400

    async def handle_request(self, body: dict, request_id: str):
        if any(body.get(k) is not None for k in ("response_format", "regex", "tools")):
            # compile the constraint in a worker (the event loop keeps serving); the submission finds it cached
            self._validate_request(body)
            _, model, processor = self._resolve_model(body)
            settings = self._build_generation_config(body, model.generation_config)
            await compile_off_loop(settings, getattr(processor, "tokenizer", processor),
                                   model.config.text_config.vocab_size)  # else 400
        return await super().handle_request(body, request_id)

    def _resolve_model(self, body: dict):
        # transformers serve names the model `ID@main` in its responses: that id is this model too
        pinned = self.model_manager.force_model
        if pinned is not None and body.get("model") == f"{pinned}@main":
            body["model"] = pinned
        return super()._resolve_model(body)

    def _build_generation_config(self, body: dict, model_generation_config, use_cb: bool = False):
        settings = request_settings(body, model_generation_config)  # BadRequestField: 400 (`openai_errors`)
        settings.constraint, settings.constraint_field = request_constraint(body)  # compiled at submission
        settings.logprobs = requested_top(body, self.chat)
        return settings

    async def _non_streaming(self, request_id, model, processor, model_id, inputs, gen_config, *args, **kwargs):
        compute = super()._non_streaming

        async def make():
            response = await compute(request_id, model, processor, model_id, inputs, gen_config, *args, **kwargs)
            if gen_config.logprobs is None:
                return response
            payload = json.loads(response.body)
            tokenizer = getattr(processor, "tokenizer", processor)
            shape = chat_logprobs if self.chat else completion_logprobs
            payload["choices"][0]["logprobs"] = shape(tokenizer, gen_config.logprob_entries)
            return JSONResponse(payload, media_type="application/json")

        return DisconnectAwareResponse(make)


class DiffusionChatHandler(DiffusionHandlerMixin, ToolsHandlerMixin, ChatCompletionHandler):
    """`/v1/chat/completions` for block diffusion (with OpenAI `tools`: serving/tools.py)."""

    _valid_params_class = DiffusionFields
    check_body = staticmethod(check_chat_body)
    # honoured: response_format (constraint_fields.py), tool_choice and parallel_tool_calls (tools.py), logprobs and
    # top_logprobs (serving/logprobs.py)
    _unused_fields = UNUSED_CHAT_COMPLETION_FIELDS - {"response_format", "tool_choice", "parallel_tool_calls",
                                                      "logprobs", "top_logprobs"}

    def _build_generation_config(self, body: dict, model_generation_config, use_cb: bool = False):
        settings = super()._build_generation_config(body, model_generation_config, use_cb)
        return with_tool_calls(settings, body)  # `tools`: the ToolCalls constraint (400 naming a bad field)

    def _build_chunk_sse(self, request_id: str = "", content=None, model=None, **kwargs) -> str:
        if isinstance(content, DraftText):
            return with_draft(super()._build_chunk_sse(request_id, model=model), content)
        if isinstance(content, LogprobText):
            sse = super()._build_chunk_sse(request_id, content=str(content), model=model, **kwargs)
            return with_logprobs(sse, chat_logprobs(content.tokenizer, content.entries))
        return super()._build_chunk_sse(request_id, content=content, model=model, **kwargs)


class DiffusionCompletionHandler(DiffusionHandlerMixin, CompletionHandler):
    """`/v1/completions` for block diffusion."""

    _valid_params_class = DiffusionTextFields
    check_body = staticmethod(check_completion_body)
    chat = False
    _unused_fields = CompletionHandler._unused_fields - {"logprobs"}  # honoured (serving/logprobs.py)

    def _build_chunk_sse(self, request_id: str, model_id: str, text: str = "", **kwargs) -> str:
        if isinstance(text, DraftText):
            return with_draft(super()._build_chunk_sse(request_id, model_id, text=""), text)
        if isinstance(text, LogprobText):
            sse = super()._build_chunk_sse(request_id, model_id, text=str(text), **kwargs)
            return with_logprobs(sse, completion_logprobs(text.tokenizer, text.entries, text.offset))
        return super()._build_chunk_sse(request_id, model_id, text=text, **kwargs)


class NotServed:
    """A route transformers serve has that block diffusion does not: answers 501 with where to go instead."""

    def __init__(self, what: str):
        self.what = what

    async def handle_request(self, *args, **kwargs):
        raise HTTPException(status_code=501, detail=f"{self.what} is not served for block diffusion; use "
                                                    "/v1/chat/completions or /v1/completions")


def openai_error(status: int, message: str, kind: str, param: str | None = None):
    """An error response in the OpenAI format (the `openai` client shows `error.message`), keeping transformers
    serve's `detail` field too."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None},
                         "detail": message}, status_code=status)


def add_error_handlers(app) -> None:
    """A bad field: 400 naming it; a full queue: 429; a constrained answer that failed its final check: 500 naming
    why."""

    @app.exception_handler(BadRequestField)
    async def bad_field(_request, error: BadRequestField):
        return openai_error(400, str(error), "invalid_request_error", error.field)

    @app.exception_handler(QueueFull)
    async def queue_full(_request, error: QueueFull):
        return openai_error(429, f"server busy: {error}; retry later", "rate_limit_error")

    @app.exception_handler(ConstrainedAnswerError)
    async def answer_failed(_request, error: ConstrainedAnswerError):
        return openai_error(500, f"the constrained answer is not valid: {error}", "server_error")
