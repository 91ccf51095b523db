"""The `logprobs` of an OpenAI-compatible answer, read for `compare --engine-url` (accuracy/engine_compare.py).

A server asked with `--logprobs` (completions `logprobs: 1`, chat `logprobs: true`) returns, per generated token, the
token and its log-probability:

    completions   choices[0].logprobs = {"tokens": [str], "token_logprobs": [float | null], ...}
    chat          choices[0].logprobs = {"content": [{"token": str, "logprob": float, ...}, ...]}

Those tokens name the answer's ids without tokenizing its text again: vLLM started with
`--return-tokens-as-token-ids` writes them as "token_id:N"; otherwise each is looked up as a vocabulary piece, then
as text that is one token, and kept only when the ids decode back into the answer's text. The reported
log-probabilities are then set beside the reference's own log-probabilities of the same tokens.

They are compared, never judged: a block-diffusion engine's log-probability of a token depends on the step that
committed it (its temperature, self-conditioning, the canvas around it), which the reference's fixed-point scoring
does not reproduce, so a difference here is a pointer for a person, not a failure.
"""

import math
from dataclasses import dataclass

ID_PREFIX = "token_id:"  # vLLM's --return-tokens-as-token-ids


class LogprobsError(ValueError):
    """A `logprobs` field that is not what the OpenAI API describes; the message names the field."""


@dataclass
class ReportedLogprobs:
    """Per generated token: the server's token string and its log-probability (None where it gave none)."""

    tokens: list[str]
    logprobs: list[float | None]


def parse_logprobs(choice: dict, chat: bool) -> ReportedLogprobs | None:
    """`choices[0].logprobs` of a (chat) completion -> ReportedLogprobs, None when absent; LogprobsError naming
    the field when malformed."""
    block = choice.get("logprobs")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise LogprobsError("`choices[0].logprobs` is not an object")
    if chat:
        content = block.get("content")
        if content is None:
            return None
        if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
            raise LogprobsError("`choices[0].logprobs.content` is not a list of objects")
        tokens = [c.get("token") for c in content]
        values = [c.get("logprob") for c in content]
        where = "choices[0].logprobs.content[].token / .logprob"
    else:
        tokens, values = block.get("tokens"), block.get("token_logprobs")
        where = "choices[0].logprobs.tokens / .token_logprobs"
        if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
            raise LogprobsError(f"`{where}` are not two lists of the same length")
    if not all(isinstance(t, str) for t in tokens):
        raise LogprobsError(f"`{where}`: a token is not a string")
    if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0
                             and not math.isnan(v)) for v in values):
        raise LogprobsError(f"`{where}`: a log-probability is not a number <= 0 (or null)")
    return ReportedLogprobs(tokens, [None if v is None else float(v) for v in values])


def ids_of_tokens(tokenizer, tokens: list[str], text: str) -> list[int] | None:
    """The ids the reported tokens name, or None when they cannot be named for sure (see the module docstring)."""
    if tokens and all(t.startswith(ID_PREFIX) for t in tokens):
        try:
            return [int(t[len(ID_PREFIX):]) for t in tokens]
        except ValueError:
            return None
    unk = tokenizer.unk_token_id
    candidates = [tokenizer.convert_tokens_to_ids(tokens)]
    pieces = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in tokens]
    if all(len(p) == 1 for p in pieces):
        candidates.append([p[0] for p in pieces])
    for ids in candidates:
        named = all(isinstance(i, int) and i != unk for i in ids)
        if named and tokenizer.decode(ids, skip_special_tokens=True) == text:
            return ids
    return None


def compare_reported(pairs: list[tuple[list[float | None], list[float]]]) -> dict | None:
    """Per answer, (reported log-probs, the reference's log-probs of the same tokens) -> a summary of the gap over
    every token both give, or None when no answer had both."""
    gaps, reported, ours = [], [], []
    for theirs, mine in pairs:
        for a, b in zip(theirs, mine):
            if a is not None:
                gaps.append(abs(a - b))
                reported.append(a)
                ours.append(b)
    if not gaps:
        return None
    n = len(gaps)
    return {"answers": len(pairs), "tokens": n, "mean_reported": sum(reported) / n, "mean_reference": sum(ours) / n,
            "mean_abs_difference": sum(gaps) / n, "max_abs_difference": max(gaps)}
