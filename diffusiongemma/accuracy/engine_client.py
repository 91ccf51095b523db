"""Asking an OpenAI-compatible server for `compare --engine-url` (accuracy/engine_compare.py): its /models
listing, and (chat) completions parsed into `Answer`s. Standard library only; every failure is an `EngineError`
naming the URL, the request and the field.
"""

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from .engine_logprobs import LogprobsError, ReportedLogprobs, parse_logprobs

TIMEOUT_S = 120.0


class EngineError(RuntimeError):
    """The server could not be asked, or its answer is malformed; the message names the request and the field."""


@dataclass
class Answer:
    """One answer to prompt `prompt` (sample `sample`), from the engine or the reference."""

    prompt: int
    sample: int
    text: str
    token_ids: list[int] | None  # the ids, when the server returned them (vLLM's `token_ids`) or named them
    finish_reason: str | None
    logprobs: ReportedLogprobs | None = None  # what the server reported, when asked with --logprobs
    ids_from: str = "text"  # where token_ids came from: "token_ids", "logprobs" or "text" (re-tokenized)


def http_json(url: str, body: dict | None, api_key: str | None, timeout: float = TIMEOUT_S) -> dict:
    """GET (body None) or POST JSON -> the decoded JSON object; EngineError naming the URL on any failure."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:300]
        raise EngineError(f"{url} answered HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise EngineError(f"cannot reach {url}: {getattr(e, 'reason', e)}") from None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise EngineError(f"{url} answered with something that is not JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise EngineError(f"{url} answered with JSON that is not an object: {raw[:200]!r}")
    return value


def served_models(base: str, api_key: str | None) -> list[dict]:
    """The entries of `GET {base}/models`, each with a string `id`."""
    listing = http_json(f"{base}/models", None, api_key)
    data = listing.get("data")
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) and isinstance(d.get("id"), str)
                                                         for d in data):
        raise EngineError(f"{base}/models: no `data[].id` in {json.dumps(listing)[:200]}")
    return data


def declared_window(base: str, name: str | None, api_key: str | None) -> tuple[str, str | None]:
    """(the model to request, the `decoder_window` its /models entry declares, None when it declares none).

    With `name` given, a server whose /models cannot be read is still asked (its window is then unknown)."""
    try:
        entries = served_models(base, api_key)
    except EngineError:
        if name is None:
            raise
        return name, None
    entry = next((d for d in entries if d["id"] == name), None) if name is not None else entries[0]
    window = entry.get("decoder_window") if entry is not None else None
    return name or entries[0]["id"], window if isinstance(window, str) else None


def parse_answer(reply: dict, url: str, chat: bool, prompt: int, sample: int) -> Answer:
    """The first choice of a (chat) completion reply; EngineError naming the missing or mistyped field."""
    where = f"{url} (prompt {prompt}, sample {sample})"
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EngineError(f"{where}: the reply has no `choices[0]`: {json.dumps(reply)[:200]}")
    choice = choices[0]
    if chat:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        field = "choices[0].message.content"
    else:
        text, field = choice.get("text"), "choices[0].text"
    if not isinstance(text, str):
        raise EngineError(f"{where}: `{field}` is missing or not a string: {json.dumps(choice)[:200]}")
    ids = choice.get("token_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
        raise EngineError(f"{where}: `choices[0].token_ids` is not a list of integers")
    try:
        logprobs = parse_logprobs(choice, chat)
    except LogprobsError as e:
        raise EngineError(f"{where}: {e}") from None
    return Answer(prompt, sample, text, ids, choice.get("finish_reason"), logprobs,
                  "token_ids" if ids is not None else "text")


def engine_answers(base: str, model_name: str, prompts: list[str], samples: int, max_tokens: int, chat: bool,
                   api_key: str | None, seed: int, logprobs: bool = False) -> list[Answer]:
    """`samples` answers per prompt from the server, sample s asked with seed `seed + s`."""
    url = f"{base}/chat/completions" if chat else f"{base}/completions"
    answers = []
    for i, prompt in enumerate(prompts):
        for s in range(samples):
            body = {"model": model_name, "max_tokens": max_tokens, "seed": seed + s}
            body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
            if logprobs:
                body["logprobs"] = True if chat else 1
            answers.append(parse_answer(http_json(url, body, api_key), url, chat, i, s))
    return answers
