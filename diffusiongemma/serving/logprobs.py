"""`logprobs` for block diffusion: one rule, computed per committed canvas, shaped as OpenAI shapes it.

The rule: a generated token's log-probability is the one the denoiser gives it at temperature 1, without
self-conditioning, when it reads the committed canvas itself after the clean prompt and the canvases before it (the
canvas as returned: the answer's tokens, then EOS and pad; tokens past `max_tokens` count as pad, tokens a `stop`
string cut off as they were). `top_logprobs` are the most likely tokens of that same distribution. This is the fixed point generation stops on (the argmax canvas no longer changes), it depends on the
answer's tokens alone, not on the sampler's random path, and it is the scoring `compare --engine-url` gives the
reference (`accuracy/engine_compare.py`), so `compare --engine-url URL --logprobs` against this server reads the
same values back. A committed token was drawn by many steps, not from one next-token distribution; no rule reports
"the" probability it was drawn with. One extra decoder pass per committed canvas, only for requests that ask.

`echo` with `logprobs` (the prompt's log-probabilities, which lm-eval's `local-completions` uses for loglikelihood)
is refused: a block-diffusion model gives no left-to-right likelihood of a prompt. The alternative is the ELBO
estimate: lm-eval's model "diffusiongemma" (`diffusiongemma eval`) or `diffusiongemma.evaluation
.continuation_loglikelihood` (docs/evaluation.md).

Legend: P prompt, L canvas length, V vocab, k top alternatives.
"""

from dataclasses import dataclass

import torch

from .settings import BadRequestField

MAX_TOP_CHAT = 20  # OpenAI's bounds: chat top_logprobs 0..20, completions logprobs 0..5
MAX_TOP_COMPLETIONS = 5
ECHO_REFUSED = ("`echo` with `logprobs` asks for the prompt's log-probabilities, which a block-diffusion model does not "
                "define (it gives no left-to-right likelihood of a prompt); score a text with the ELBO estimate "
                "instead: `diffusiongemma eval` / lm-eval's model \"diffusiongemma\" (docs/evaluation.md)")


def _int(name: str, value, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise BadRequestField(name, f"must be an integer in [0, {high}], got {value!r}")
    return value


def requested_top(body: dict, chat: bool) -> int | None:
    """The alternatives per token a request asks for (0: the chosen token's value only), or None: no logprobs.

    chat: `logprobs: true` and `top_logprobs: 0..20`; completions: `logprobs: 0..5`. A 400 names the field otherwise,
    and `echo` with logprobs is refused (module docstring)."""
    if chat:
        wanted, top = body.get("logprobs"), body.get("top_logprobs")
        if wanted is not None and not isinstance(wanted, bool):
            raise BadRequestField("logprobs", f"must be true or false, got {wanted!r}")
        if not wanted:
            if top:
                raise BadRequestField("top_logprobs", "needs `logprobs: true`")
            return None
        return _int("top_logprobs", top, MAX_TOP_CHAT) if top is not None else 0
    wanted = body.get("logprobs")
    if wanted is None:
        return None
    top = _int("logprobs", wanted, MAX_TOP_COMPLETIONS)
    if body.get("echo"):
        raise BadRequestField("echo", ECHO_REFUSED)
    return top


class LogprobText(str):
    """Text of committed tokens with their `TokenLogprob`s (`entries`); `offset` is where the text starts in the
    answer (completions' `text_offset`), `tokenizer` names the tokens."""

    entries: list
    offset: int
    tokenizer: object

    def __new__(cls, text: str, entries: list, offset: int, tokenizer):
        item = super().__new__(cls, text)
        item.entries, item.offset, item.tokenizer = entries, offset, tokenizer
        return item


@dataclass
class TokenLogprob:
    """One generated token: its id and log-probability, and the top alternatives as (id, log-probability)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class CanvasScorer:
    """Scores each committed canvas of one request by the rule of the module docstring.

    Args:
        model: the served model.
        top: alternatives per token (0: none).
    """

    def __init__(self, model, top: int):
        self.model, self.top = model, top
        self.prefix: list[int] = []  # the prompt, then every committed canvas

    def start(self, prompt: list[int]) -> None:
        self.prefix = list(prompt)

    @torch.no_grad()
    def score(self, canvas: list[int]) -> list[TokenLogprob]:
        """canvas: the L ids just committed -> one `TokenLogprob` per id; the canvas joins the prefix."""
        from ..evaluation.elbo import fixed_point_logits

        device = self.model.device
        context = torch.tensor(self.prefix, dtype=torch.long, device=device)  # [P]
        labels = torch.tensor(canvas, dtype=torch.long, device=device)  # [L]
        logp = torch.log_softmax(fixed_point_logits(self.model, context, labels).float(), dim=-1)  # [L, V]
        chosen = logp.gather(-1, labels[:, None])[:, 0].tolist()  # [L]
        tops = logp.topk(self.top, dim=-1) if self.top else None  # [L, k]
        alternatives = (list(zip(tops.indices.tolist(), tops.values.tolist())) if tops is not None
                        else [([], [])] * len(canvas))
        self.prefix += canvas
        return [TokenLogprob(t, v, list(zip(*alt))) for t, v, alt in zip(canvas, chosen, alternatives)]


def _piece(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer, entries: list[TokenLogprob]) -> dict:
    """OpenAI chat `choices[].logprobs`: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}."""
    def item(token_id: int, value: float) -> dict:
        text = _piece(tokenizer, token_id)
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, v) for t, v in e.top]}
                        for e in entries], "refusal": None}


def completion_logprobs(tokenizer, entries: list[TokenLogprob], text_offset: int = 0) -> dict:
    """OpenAI completions `choices[].logprobs`: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}."""
    tokens = [_piece(tokenizer, e.token_id) for e in entries]
    offsets, at = [], text_offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_piece(tokenizer, t): v for t, v in e.top} for e in entries], "text_offset": offsets}
