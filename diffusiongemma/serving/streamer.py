"""The streamer of one served request: transformers serve's `DirectStreamer` taught the block-diffusion contract.

Spec D.7: `put(prompt)`, then `put_draft(value=[1, L])` after every denoising step and `put([1, L])` for every committed
canvas, then `end()`. Committed tokens become ordinary text items on the request's queue (decoded incrementally, fed
through the response parser when the model has one, exactly as `DirectStreamer` does); drafts, when the request asked
for them, become `DraftText` items that the handlers turn into the documented `draft` field of a chunk (with each
position's token and confidence, or the `diffusion_frame` fields, when asked: drafts.py). A request that asked for
`logprobs` has a `scorer` (serving/logprobs.py) that scores each committed canvas; the tokens whose text has been sent
go out as `LogprobText` items (with that text, or after the parser's items, with none).

The response holds at most `max_new_tokens` tokens and ends at the first EOS; a `stop` string ends it too (the text
before it is kept, and `generated`, which the usage and `finish_reason` count, keeps only the tokens whose text lies
wholly before it). Either way `abandoned` tells the scheduler to drop the row at the next step boundary, as does
`cancel()` (a client that went away).

A constrained response is checked when it ends (constraints/answer_check.py): the streamed text, the decoded text
and, for a JSON schema, `jsonschema` must all accept it. If not, the stream ends with an error event naming why
(a non-streamed request gets a 500 with it) instead of a finish_reason.
"""

import json
import logging
import threading

from transformers.cli.serving.utils import (DirectStreamer, _GenerationCancelled, _StreamError,
                                            response_events_to_chunks)

from .drafts import DraftText
from .logprobs import LogprobText
from .settings import RequestSettings

logger = logging.getLogger(__name__)


class ConstrainedAnswerError(RuntimeError):
    """A non-streamed constrained answer failed the final check: the server answers 500 with the reason."""


class AnswerFailed(_StreamError):
    """The end of a constrained response whose answer failed the final check. `message` is the reason; `msg` is it
    JSON-escaped, since transformers serve writes `msg` between quotes into an SSE `error` event."""

    def __init__(self, message: str):
        super().__init__(json.dumps(message)[1:-1])
        self.message = message


class RowStreamer(DirectStreamer):
    """Streams one request. Called from the scheduler thread; items reach `queue` through `loop`.

    Args:
        tokenizer: the transformers tokenizer (drafts are decoded whole with it; commits incrementally with its Rust
            tokenizer, as `DirectStreamer` does).
        loop / queue: the request's event loop and asyncio queue.
        settings: the request's `RequestSettings` (max_new_tokens, stop, stream_drafts, EOS ids).
        response_parser: transformers' `ResponseParser` for models with a response template, else None.
    """

    def __init__(self, tokenizer, loop, queue, settings: RequestSettings, response_parser=None):
        super().__init__(tokenizer._tokenizer, loop, queue, response_parser=response_parser)
        self.tokenizer = tokenizer
        self.max_new_tokens = settings.max_new_tokens
        self.stop = settings.stop
        self.drafts = settings.stream_drafts
        self._pieces: dict[int, str] = {}  # token id -> its text alone (the drafts' per-position tokens)
        eos = settings.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        self.settings = settings
        if settings.automaton is not None and settings.automaton.pad_id is not None:
            self.eos_ids.add(settings.automaton.pad_id)  # a constrained answer is complete where padding begins
        self.generated: list[int] = []  # committed ids of the response, up to and including the first EOS
        self.canvas = 0  # canvases committed
        self.step = 0  # denoising steps of the current canvas
        self.ended = False
        self._done = False  # EOS, max_new_tokens or a stop string reached
        self._held = ""  # text held back: it may be the start of a stop string
        self._text_len = 0  # characters decoded from `generated` so far
        self._ends: list[int] = []  # per generated token: `_text_len` after it
        self._streamed: list[str] = []  # every piece of text decoded, as the client receives it
        self._end_lock = threading.Lock()
        self.raise_on_cancel = False  # set when `model.generate` drives this streamer: raising aborts it
        self.scorer = None  # a `logprobs.CanvasScorer` when the request asked for logprobs
        self.entries: list = []  # per generated token: its `TokenLogprob` (with a scorer)
        self._sent_chars = 0  # characters of the answer sent so far
        self._sent_entries = 0  # entries sent so far

    @property
    def abandoned(self) -> bool:
        """The row need not run any more: the client left, or the response is complete."""
        return self._cancelled.is_set() or self._done

    def _enqueue(self, item) -> None:
        try:
            super()._enqueue(item)
        except RuntimeError:  # the server's event loop is closed (shutting down): nobody is listening
            pass

    def _check_cancelled(self) -> bool:
        """Whether the client left; under `model.generate` this raises instead, which aborts the call."""
        if self._cancelled.is_set() and self.raise_on_cancel:
            raise _GenerationCancelled()
        return self._cancelled.is_set()

    def _emit(self, text: str) -> None:
        start = self._sent_chars
        self._sent_chars += len(text)
        due = self._due_entries()
        if not text and not due:
            return
        if self._parser is None:
            self._enqueue(LogprobText(text, due, start, self.tokenizer) if self.scorer is not None else text)
            return
        for item in response_events_to_chunks(self._parser.feed(text)) if text else ():
            self._enqueue(item)
        if due:
            self._enqueue(LogprobText("", due, start, self.tokenizer))

    def _due_entries(self) -> list:
        """The entries of the tokens whose text is now wholly sent and that were not sent yet (EOS left out: OpenAI
        reports the answer's tokens); kept on the settings for a non-streaming response too."""
        if self.scorer is None:
            return []
        done = sum(1 for end in self._ends if end <= self._sent_chars)
        due = [e for e in self.entries[self._sent_entries : done] if e.token_id not in self.eos_ids]
        self._sent_entries = max(self._sent_entries, done)
        self.settings.logprob_entries += due
        return due

    def _filter_stop(self, text: str, final: bool) -> str:
        """Text safe to send now: everything before a stop string (then the response is done), else all but the tail
        that could still begin one."""
        pending = self._held + text
        hits = [i for i in (pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            self._held, self._done = "", True
            cut = self._text_len - len(pending) + min(hits)  # where the stop string starts in the whole response
            kept = sum(1 for end in self._ends if end <= cut)
            self.generated, self._ends, self.entries = self.generated[:kept], self._ends[:kept], self.entries[:kept]
            self.total_tokens = kept
            return pending[: min(hits)]
        keep = 0 if final or not self.stop else min(len(pending), max(len(s) for s in self.stop) - 1)
        self._held = pending[len(pending) - keep :]
        return pending[: len(pending) - keep]

    def put(self, value) -> None:
        """value [1, n] or [n]: the prompt (first call, skipped) or a committed canvas."""
        if self._check_cancelled():
            return
        if self._first:
            self._first = False
            if self.scorer is not None:
                self.scorer.start(value.reshape(-1).tolist())
            return
        self.canvas, self.step = self.canvas + 1, 0
        pieces = []
        canvas = value.reshape(-1).tolist()
        scored = None
        if self.scorer is not None and not self._done:  # tokens past max_tokens are scored as pad (logprobs.py)
            room = max(self.max_new_tokens - len(self.generated), 0)
            pad = self.settings.config.pad_token_id
            scored = self.scorer.score(canvas if room >= len(canvas) or pad is None
                                       else canvas[:room] + [pad] * (len(canvas) - room))
        for i, token in enumerate(canvas):
            if self._done or len(self.generated) >= self.max_new_tokens:
                break
            self.generated.append(token)
            if scored is not None:
                self.entries.append(scored[i])
            text = self._decode_stream.step(self._tokenizer, token)
            if text:
                pieces.append(text)
                self._streamed.append(text)
                self._text_len += len(text)
            self._ends.append(self._text_len)
            if token in self.eos_ids:
                self._done = True
        self.total_tokens = len(self.generated)
        if len(self.generated) >= self.max_new_tokens:
            self._done = True
        self._emit(self._filter_stop("".join(pieces), final=False))  # a stop string may shorten `generated`

    def put_draft(self, value=None, logits=None, confidence: list[float] | None = None) -> None:
        """value [1, L]: the argmax canvas after a denoising step; confidence: its L positions' confidences
        (`drafts.draft_confidence`), given when the request asked for them."""
        if self._check_cancelled():
            return
        self.step += 1
        if not self.drafts or value is None or self._done:
            return
        canvas = value.reshape(-1).tolist()
        budget = self.max_new_tokens - len(self.generated)  # positions that may still enter the answer
        text = self.tokenizer.decode(canvas[:budget], skip_special_tokens=True)
        detail = None
        if self.settings.draft.confidence:
            detail = {"tokens": [self._piece(t) for t in canvas], "confidence": confidence,
                      "budget": min(budget, len(canvas)), "max_steps": self.settings.config.max_denoising_steps}
        self._enqueue(DraftText(text, self.canvas, self.step, detail, self.settings.config.max_denoising_steps,
                                self.settings.draft.frame))

    def _piece(self, token: int) -> str:
        """One token's text decoded alone, special tokens included (a canvas position of the draft)."""
        if token not in self._pieces:
            self._pieces[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return self._pieces[token]

    def end(self) -> None:
        """Flush the held-back text and close the stream (once, whoever calls it)."""
        with self._end_lock:
            if self.ended:
                return
            self.ended = True
        self._emit(self._filter_stop("", final=True))
        self._complete_answer_is_a_stop()
        problem = self._constrained_answer_problem()
        if problem is not None:  # never a "stop" for an answer that is not valid as the client received it
            logger.error(f"constrained answer refused: {problem}")
            self._enqueue(AnswerFailed(problem))
            self._enqueue(None)
            return
        super().end()

    def _constrained_answer_problem(self) -> str | None:
        """Why a constrained answer that ended (EOS, pad) is not a whole valid one as the client received it (the
        streamed text, the decoded text, the schema: constraints/answer_check.py), or None. An answer the budget
        cut is not a problem: it ends with finish_reason "length"."""
        automaton = self.settings.automaton
        if automaton is None or self._cancelled.is_set() or not self.generated:
            return None
        import torch

        from ..constraints.answer_check import answer_ids, answer_problem, ended_early, spelled_text

        tokens = torch.tensor([self.generated], device=automaton.token_class.device)
        start = torch.tensor([automaton.initial], device=tokens.device)
        complete = bool(automaton.complete(automaton.walk(start, tokens))[0])
        problem = answer_problem(automaton, self.tokenizer, self.generated, complete)
        if problem is not None:
            return problem
        ids = answer_ids(self.generated, automaton.end_ids)
        if not complete and len(ids) < len(self.generated):
            return ended_early(automaton)
        streamed, spelled = "".join(self._streamed), spelled_text(automaton, ids)
        if streamed != spelled and not getattr(automaton.constraint, "special_texts", ()):  # (ToolCalls' special
            # tokens are skipped by the stream's decoder and read by the tools parser instead: serving/tools.py)
            return (f"{automaton.description}: the streamed text {streamed[:80]!r} differs from the text the tokens "
                    f"spell {spelled[:80]!r} (a bug of diffusiongemma's constrained decoding: please report it)")
        return None

    def _complete_answer_is_a_stop(self) -> None:
        """transformers serve answers finish_reason "length" when the response holds `max_new_tokens` tokens. A
        constrained answer that is complete exactly there is a "stop": the handlers read the budget from these
        settings after the stream ended, so it is cleared for them. An incomplete one stays "length"."""
        automaton = self.settings.automaton
        if automaton is None or not self.generated or len(self.generated) < self.max_new_tokens:
            return
        import torch

        tokens = torch.tensor([self.generated], device=automaton.token_class.device)
        if bool(automaton.complete(automaton.walk(torch.tensor([automaton.initial], device=tokens.device),
                                                  tokens))[0]):
            self.settings.max_new_tokens = None

    def fail(self, message: str) -> None:
        """End the stream with an error item (the handlers send it as an SSE error)."""
        from transformers.cli.serving.utils import _StreamError

        with self._end_lock:
            if self.ended:
                return
            self.ended = True
        self._enqueue(_StreamError(message))
        self._enqueue(None)
