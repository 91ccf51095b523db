"""Observers of the row pool's pass events (`pool.PassEvents`): what watches a run, never part of it. A streamer
follows a lock-step batch (`StreamerObserver`) or a mixed one (`RoundStreamer`); the trace recorder lives with the
trace format (`diffusiongemma.accuracy.record.TraceRecorder.observe`); the server streams each request's row
(serving/scheduler.py).

The streamer contract is the built-in's (spec D.7): `put(prompt [B, P])`, `put_draft(value=[B, L])` after every step
(if the streamer has that method), `put(canvases [B, L])` after every commit, then `end()`.

Legend: B batch, P prompt, L canvas length, V vocab.
"""

import torch


def takes_logits(streamer) -> bool:
    """The streamer wants the tempered logits instead of the argmax canvas as its draft (spec D.4.4j)."""
    return streamer is not None and getattr(streamer, "_takes_logits", False)


def wants_drafts(streamer) -> bool:
    """The streamer takes argmax drafts (`put_draft(value=...)`)."""
    return streamer is not None and hasattr(streamer, "put_draft") and not takes_logits(streamer)


class StreamerObserver:
    """A streamer over a lock-step batch: `put_draft` after every step (the batch's argmax canvases [B, L], or its
    tempered logits [B, L, V] for a streamer that takes logits), `put(canvases [B, L])` after every commit."""

    def __init__(self, streamer, embed_dtype: torch.dtype):
        self.streamer, self.embed_dtype = streamer, embed_dtype
        self.drafts = hasattr(streamer, "put_draft")
        self.logits = takes_logits(streamer)

    def __call__(self, events) -> None:
        if self.drafts and self.logits:
            for record in events.records:
                self.streamer.put_draft(logits=record.result.logits.to(self.embed_dtype).cpu())
        elif self.drafts and events.drafts:
            self.streamer.put_draft(value=torch.cat([d for _, d, _ in events.drafts]).cpu())  # [B, L]
        if events.committed:
            self.streamer.put(torch.stack([c for _, c in events.committed]).cpu())  # [B, L]


class RoundStreamer:
    """A streamer over a mixed batch, where rows commit in different passes: it still gets the batch round by round.

    `put(canvases [B, L])` for canvas c once every row committed its c-th canvas or finished before it (those rows
    give `fill`, as lock-step pads a finished row); `put_draft(value=[B, L])` after every pass that stepped a row,
    each row at its latest draft (`fill` before its first).
    """

    def __init__(self, streamer, batch: int, canvas_length: int, fill: int):
        self.streamer, self.B = streamer, batch
        self.fill = torch.full((canvas_length,), fill, dtype=torch.long)
        self.latest = torch.full((batch, canvas_length), fill, dtype=torch.long)  # [B, L] on the CPU
        self.rounds: dict[int, dict[int, torch.Tensor]] = {}  # canvas -> {row: canvas [L]}
        self.ended: dict[int, int] = {}  # row -> canvases it committed in all
        self.sent = 0  # rounds put so far
        self.drafts = wants_drafts(streamer)

    def __call__(self, events) -> None:
        if self.drafts and events.drafts:
            for r, draft, _ in events.drafts:
                self.latest[r.index] = draft[0]
            self.streamer.put_draft(value=self.latest.clone())
        for r, canvas in events.committed:
            self.rounds.setdefault(len(r.canvases) - 1, {})[r.index] = canvas.cpu()
        for r in events.finished:
            self.ended[r.index] = len(r.canvases)
        while self._round_ready(self.sent):
            got = self.rounds.pop(self.sent)
            self.streamer.put(torch.stack([got.get(b, self.fill) for b in range(self.B)]))  # [B, L]
            self.sent += 1

    def _round_ready(self, c: int) -> bool:
        got = self.rounds.get(c)
        return bool(got) and all(b in got or self.ended.get(b, c + 1) <= c for b in range(self.B))
