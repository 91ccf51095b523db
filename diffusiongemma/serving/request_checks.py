"""The shape of a request body, checked before transformers serve reads it: fields this server cannot honour, and the
types of `messages`, `prompt`, `stream` and `chat_template_kwargs` (which transformers serve would otherwise trip
over with a bare 500, or read loosely: `"stream": "false"` is a true string and streams).

`UNSUPPORTED` is the one table of OpenAI fields the server refuses with a 400 naming the field, each with its
reason, unless the value is the one that asks for nothing (`n: 1`, `logprobs: false`, ...). A feature that learns to
honour a field removes its row (`response_format` is honoured: constraint_fields.py).
"""

from .logprobs import requested_top
from .settings import BadRequestField

# field -> (values that ask for nothing and are accepted, why anything else is refused)
UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "n": ((1,), "one choice per request: send several requests (each with its own seed)"),
    "best_of": ((1,), "one choice per request: send several requests"),
    "echo": ((False,), "the prompt is not echoed back"),
    "function_call": (("auto",), "deprecated functions API: use `tools`"),
    "functions": ((), "deprecated functions API: use `tools`"),
    "presence_penalty": ((0, 0.0), "repetition penalties are not applied by block diffusion"),
    "frequency_penalty": ((0, 0.0), "repetition penalties are not applied by block diffusion"),
    "logit_bias": (({},), "token biases are not applied"),
    "generation_config": ((), "send the diffusion settings as body fields instead (max_denoising_steps, t_min, t_max, "
                              "entropy_bound, stability_threshold, confidence_threshold, sampling)"),
    "audio": ((), "audio output is not served"),
    "modalities": ((["text"],), "the server answers text only"),
    "prediction": ((), "predicted outputs are not served"),
    "reasoning_effort": ((), "not applied by this model"),
    "verbosity": ((), "not applied by this model"),
    "web_search_options": ((), "web search is not served"),
}
TEXT_PARTS = ("text", "input_text", "output_text")
ROLES = ("system", "developer", "user", "assistant", "tool")
# apply_chat_template arguments transformers serve passes itself: a request repeating one would be a TypeError
TEMPLATE_ARGS = ("conversation", "add_generation_prompt", "tools", "return_tensors", "return_dict", "tokenize",
                 "load_audio_from_video", "documents", "chat_template", "continue_final_message", "padding",
                 "truncation", "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask")


def _asks_for_nothing(value, neutral: tuple) -> bool:
    return any(type(value) is type(n) and value == n for n in neutral)


def check_unsupported(body: dict) -> None:
    """A 400 naming the first field of `UNSUPPORTED` the body sets to something other than its neutral value."""
    for name, (neutral, reason) in UNSUPPORTED.items():
        if body.get(name) is not None and not _asks_for_nothing(body[name], neutral):
            raise BadRequestField(name, f"not supported by this server, got {body[name]!r}: {reason}")


def check_stream(body: dict) -> None:
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise BadRequestField("stream", f"must be true or false, got {body['stream']!r}")


def check_messages(body: dict) -> None:
    """`messages`: a non-empty list of objects with a known `role` and text content (a string or text parts)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestField("messages", f"must be a non-empty list of message objects, got {messages!r}"[:300])
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequestField(where, f"must be an object with `role` and `content`, got {message!r}"[:300])
        if message.get("role") not in ROLES:
            raise BadRequestField(f"{where}.role", f"must be one of {list(ROLES)}, got {message.get('role')!r}")
        content = message.get("content")
        if content is None:
            if message["role"] == "assistant" and message.get("tool_calls"):
                continue
            raise BadRequestField(f"{where}.content", "is missing (only an assistant message with `tool_calls` may "
                                                      "leave it out)")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise BadRequestField(f"{where}.content", f"must be a string or a list of parts, got {content!r}"[:300])
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in TEXT_PARTS:
                raise BadRequestField(f"{where}.content[{j}]", f"only text parts are served (this server takes text "
                                                               f"prompts), got a part of type {kind!r}")
            if not isinstance(part.get("text"), str):
                raise BadRequestField(f"{where}.content[{j}].text", f"must be a string, got {part.get('text')!r}")


def check_prompt(body: dict) -> None:
    """`prompt` (legacy completions): a non-empty string."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BadRequestField("prompt", f"must be a non-empty string, got {prompt!r}"[:300])


def check_template_kwargs(body: dict) -> None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise BadRequestField("chat_template_kwargs", f"must be an object with identifier keys, got {kwargs!r}"[:300])
    taken = sorted(set(kwargs) & set(TEMPLATE_ARGS))
    if taken:
        raise BadRequestField("chat_template_kwargs", f"{taken} are set by the server itself; only template "
                                                      "variables may be passed")


def check_chat_body(body: dict) -> None:
    requested_top(body, chat=True)  # `logprobs` / `top_logprobs` (serving/logprobs.py)
    check_unsupported(body)
    check_stream(body)
    check_messages(body)
    check_template_kwargs(body)


def check_completion_body(body: dict) -> None:
    requested_top(body, chat=False)  # `logprobs`, and `echo` with it refused with its reason (serving/logprobs.py)
    check_unsupported(body)
    check_stream(body)
    check_prompt(body)
