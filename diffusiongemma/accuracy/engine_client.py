"""Asking an OpenAI-compatible server for `compare --engine-url` (accuracy/engine_compare.py): its /models
listing, and (chat) completions parsed into `Answer`s. Standard library only; every failure is an `EngineError`
naming the URL, the request and the field.

Every request has a total deadline (`--request-timeout`): a socket timeout only bounds the wait for the next byte,
so a server that trickles bytes or streams keep-alives would hold a request forever. A timer shuts the socket down
when the deadline passes, which ends whatever read is blocked, headers included.
"""

import http.client
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

from .engine_logprobs import LogprobsError, ReportedLogprobs, parse_logprobs

TIMEOUT_S = 120.0  # the longest wait for the next byte
REQUEST_TIMEOUT_S = 300.0  # the default total deadline of one request (connect, send, headers and body)


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
    completion_tokens: int | None = None  # the reply's `usage.completion_tokens`, when it has one


def check_base_url(base: str) -> str:
    """`base` without a trailing slash, or EngineError naming `--engine-url`: an http(s) URL with a host."""
    try:
        parts = urllib.parse.urlsplit(base)
        parts.port  # noqa: B018 -- raises ValueError on a port that is not a number in range
    except ValueError as e:
        raise EngineError(f"--engine-url {base!r} is not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError(f"--engine-url {base!r} must be an http:// or https:// URL with a host, e.g. "
                          "http://127.0.0.1:8000/v1")
    return base.rstrip("/")


def _request(url: str, body: dict | None, api_key: str | None, deadline: float) -> tuple[int, bytes]:
    """(HTTP status, body bytes) of one GET (body None) or POST JSON; socket.timeout once `deadline`
    (time.monotonic()) passes, whatever phase the request is in."""
    parts = urllib.parse.urlsplit(url)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout()
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=min(TIMEOUT_S, remaining))
    expired = threading.Event()

    def expire():
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # ends a recv blocked in another thread
            except OSError:
                pass

    timer = threading.Timer(remaining, expire)
    timer.daemon = True
    timer.start()
    try:
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        path = parts.path or "/"
        path += f"?{parts.query}" if parts.query else ""
        connection.request("GET" if body is None else "POST", path,
                           None if body is None else json.dumps(body).encode(), headers)
        response = connection.getresponse()
        chunks = []
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if expired.is_set():
                break
        if expired.is_set():
            raise socket.timeout()
        return response.status, b"".join(chunks)
    except (OSError, http.client.HTTPException):
        if expired.is_set():
            raise socket.timeout() from None
        raise
    finally:
        timer.cancel()
        connection.close()


def http_json(url: str, body: dict | None, api_key: str | None, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    """GET (body None) or POST JSON -> the decoded JSON object, within `timeout` seconds in all; EngineError naming
    the URL on any failure."""
    try:
        status, raw = _request(url, body, api_key, time.monotonic() + timeout)
    except socket.timeout:
        raise EngineError(f"{url} sent no complete answer within {timeout:g} s (--request-timeout); a server that "
                          "trickles bytes or keep-alives never ends a request by itself") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise EngineError(f"cannot reach {url}: {e or type(e).__name__}") from None
    if not 200 <= status < 300:
        raise EngineError(f"{url} answered HTTP {status}: {raw.decode(errors='replace')[:300]}")
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EngineError(f"{url} answered with something that is not JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise EngineError(f"{url} answered with JSON that is not an object: {raw[:200]!r}")
    return value


def served_models(base: str, api_key: str | None, timeout: float = REQUEST_TIMEOUT_S) -> list[dict]:
    """The entries of `GET {base}/models`, each with a string `id`."""
    listing = http_json(f"{base}/models", None, api_key, timeout)
    data = listing.get("data")
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) and isinstance(d.get("id"), str)
                                                         for d in data):
        raise EngineError(f"{base}/models: no `data[].id` in {json.dumps(listing)[:200]}")
    return data


def declared_window(base: str, name: str | None, api_key: str | None,
                    timeout: float = REQUEST_TIMEOUT_S) -> tuple[str, str | None]:
    """(the model to request, the `decoder_window` its /models entry declares, None when it declares none).

    With `name` given, a server whose /models cannot be read is still asked (its window is then unknown)."""
    try:
        entries = served_models(base, api_key, timeout)
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
    if ids is not None and not (isinstance(ids, list) and all(_is_count(i) for i in ids)):  # JSON true is no id
        raise EngineError(f"{where}: `choices[0].token_ids` is not a list of integers >= 0: {json.dumps(ids)[:200]}")
    reason = choice.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise EngineError(f"{where}: `choices[0].finish_reason` is not a string: {json.dumps(reason)[:100]}")
    usage = reply.get("usage")
    used = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if used is not None and not _is_count(used):
        raise EngineError(f"{where}: `usage.completion_tokens` is not an integer >= 0: {json.dumps(used)[:100]}")
    try:
        logprobs = parse_logprobs(choice, chat)
    except LogprobsError as e:
        raise EngineError(f"{where}: {e}") from None
    return Answer(prompt, sample, text, ids, reason, logprobs, "token_ids" if ids is not None else "text", used)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def engine_answers(base: str, model_name: str, prompts: list[str], samples: int, max_tokens: int, chat: bool,
                   api_key: str | None, seed: int, logprobs: bool = False,
                   timeout: float = REQUEST_TIMEOUT_S) -> list[Answer]:
    """`samples` answers per prompt from the server, sample s asked with seed `seed + s`, each request within
    `timeout` seconds."""
    url = f"{base}/chat/completions" if chat else f"{base}/completions"
    answers = []
    for i, prompt in enumerate(prompts):
        for s in range(samples):
            body = {"model": model_name, "max_tokens": max_tokens, "seed": seed + s}
            body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
            if logprobs:
                body["logprobs"] = True if chat else 1
            answers.append(parse_answer(http_json(url, body, api_key, timeout), url, chat, i, s))
    return answers
