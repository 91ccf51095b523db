"""The pool's forward passes: how one pass runs the model over the pool's rows. The pool (`pool.py`) decides what
each row does; a forward only runs it and hands back the hidden states (or logits) of the rows that sample.

* `RowForward` (mixed batching, the server): one forward mixing prefill, commit and denoising rows over a
  `RowCache` with one committed length per row (`model.run_rows`); with `batch_invariant` one forward per row; with
  `compile`, the encoder rows eager and the denoising rows through the fixed-shape compiled pass
  (`modeling.compile.RowDenoisePass`) of their row bucket.
* `SharedForward` (lock-step batching): every row is in the same phase, so a pass is the built-in's own pass over
  one shared `BlockDiffusionCache`: the padded prompt [B, P] or the committed canvases [B, L] in encoder mode, the
  canvases [B, L] in decoder mode (the exact shapes bit-exact parity needs), or, with `compile`, the fixed-shape
  compiled decoder + head (`modeling.compile.DenoisePass`).

A forward returns a `Forward`: which rows' canvases were denoised (`sampled`, pool slots), their hidden states
[d, L, H] (or logits [d, L, V] fp32 from a compiled pass), and the rows that ran in encoder mode.

Legend: n rows in the pool, d rows that sample, T tokens in a pass, P prompt, L canvas length, H hidden, V vocab.
"""

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from ..modeling.compile import row_bucket
from ..modeling.host import device_tensor
from ..modeling.masks import PaddingSlots
from ..modeling.vision import stack_rows

PREFILL, COMMIT, DENOISE = "prefill", "commit", "denoise"


@dataclass
class Forward:
    """What one forward produced."""

    sampled: list[int]  # pool slots of the rows whose canvas was denoised and now samples
    hidden: torch.Tensor | list | None  # [d, L, H], or d [1, L, H] (batch-invariant), or None
    encoding: list  # rows that ran in encoder mode (prefill or commit)
    logits: torch.Tensor | None = None  # [d, L, V] fp32 when the pass ran the head (compiled)


class RowForward:
    """Mixed batching: rows in any phase share one `model.run_rows` pass over a `RowCache` (or, batch-invariant,
    one pass per row over its own cache: `invariant.py`, place 1).

    With `denoise_pass` (a `modeling.compile.RowDenoisePass`) a pass is two forwards at most: the encoder rows
    (prefill, commit) eager through `run_rows` over their slots only (`RowCache.rows`), then the compiled, fixed-shape
    decoder + head over pool rows [0, R) (R = `row_bucket(n)`) against slots [0, `capacity`). Rows of the bucket that
    do not denoise feed a zero canvas and discard their logits; their canvas keys/values land at slots S_b + [0, L),
    at or past their committed length (the encoder rows have already advanced), which every mask hides and their own
    next pass overwrites, so they disturb nothing.
    """

    def __init__(self, model, cache, batch_invariant: bool = False, denoise_pass=None, capacity: int = 0):
        self.model, self.cache, self.batch_invariant = model, cache, batch_invariant
        self.denoise_pass, self.capacity = denoise_pass, capacity or getattr(cache, "capacity", 0)
        self._zeros: dict = {}  # (shape, dtype) -> zero canvas / soft rows for the bucket's idle rows

    def __call__(self, active: list) -> Forward:
        L = self.model.canvas_length
        if self.denoise_pass is not None:
            return self.compiled(active, L)
        if not self.batch_invariant:
            sampled, hidden, encoding = forward_rows(self.model, active, self.cache, L)
            return Forward(sampled, hidden, encoding)
        sampled, hidden, encoding = [], [], []
        for i, r in enumerate(active):
            d, h, e = forward_rows(self.model, [r], self.cache.row(i), L)
            sampled += [i] * len(d)
            hidden += [h] * len(d)  # [1, L, H] each
            encoding += e
        return Forward(sampled, hidden, encoding)

    def compiled(self, active: list, L: int) -> Forward:
        """The encoder rows eager, then the compiled pass over the row bucket; logits of the denoising rows."""
        encoding = [r for r in active if r.phase != DENOISE]
        if encoding:
            slots = [i for i, r in enumerate(active) if r.phase != DENOISE]
            forward_rows(self.model, encoding, self.cache.rows(slots), L)
        denoising = [i for i, r in enumerate(active) if r.phase == DENOISE]
        if not denoising:
            return Forward([], None, encoding)
        R = row_bucket(len(active), self.cache.batch)
        longest = max(self.cache.lengths[:R]) + L
        if longest > self.capacity:
            raise ValueError(f"a compiled pass needs {longest} cache slots, the capacity bucket holds {self.capacity}")
        canvas = torch.stack([r.tokens if r.phase == DENOISE else self._zero((L,), torch.long, r.tokens.device)
                              for r in active] + [self._zero((L,), torch.long, active[0].tokens.device)]
                             * (R - len(active)))  # [R, L]
        soft_like = next((r.soft for r in active if r.phase == DENOISE and r.soft is not None), None)
        if soft_like is None:  # every row on its first step: one cached zero input
            H = self.model.config.text_config.hidden_size
            dtype = self.model.get_decoder().embed_tokens.weight.dtype
            soft = self._zero((R, L, H), dtype, canvas.device)
        else:
            zero = self._zero(tuple(soft_like.shape), soft_like.dtype, soft_like.device)
            soft = torch.stack([r.soft if r.phase == DENOISE and r.soft is not None else zero for r in active]
                               + [zero] * (R - len(active)))  # [R, L, H]
        logits = self.denoise_pass(canvas, self.cache, soft, self.capacity)  # [R, L, V] fp32
        if denoising != list(range(len(denoising))):
            logits = logits[device_tensor(denoising, torch.long, logits.device)]
        return Forward(denoising, None, encoding, logits=logits[: len(denoising)])  # [d, L, V]

    def _zero(self, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
        key = (shape, dtype, device)
        if key not in self._zeros:
            self._zeros[key] = torch.zeros(shape, dtype=dtype, device=device)
        return self._zeros[key]

    def reset(self, slot: int) -> None:
        self.cache.reset(slot)

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)


def forward_rows(model, active: list, cache, L: int) -> tuple[list[int], torch.Tensor | None, list]:
    """One forward over rows in any phase (prefill, commit, denoise), each with its own committed length in `cache`.

    Returns the slots of the denoising rows, their canvas hidden states [d, L, H] (None if none denoise), and the
    rows that ran in encoder mode (prefill or commit).
    """
    tokens = pad_sequence([r.tokens for r in active], batch_first=True)  # [n, T], zero padded
    q_lens = [len(r.tokens) for r in active]
    encoder_rows = [r.phase != DENOISE for r in active]
    soft_slots = [i for i, r in enumerate(active) if r.phase == DENOISE and r.soft is not None]
    soft = torch.stack([active[i].soft for i in soft_slots]) if soft_slots else None
    # prefill rows may carry image features (`images`: PromptImages), scattered into their placeholders
    images = stack_rows([r.images if r.phase == PREFILL else None for r in active], q_lens, tokens.shape[1])
    hidden = model.run_rows(tokens, cache, q_lens, encoder_rows, soft, soft_slots, images)  # [n, T, H]
    denoising = [i for i, r in enumerate(active) if r.phase == DENOISE]
    encoding = [r for r in active if r.phase != DENOISE]
    picked = hidden[device_tensor(denoising, torch.long, hidden.device), :L] if denoising else None  # [d, L, H]
    return denoising, picked, encoding


class SharedForward:
    """Lock-step batching: every row shares one `BlockDiffusionCache` and one phase per pass (spec D.4.1-4).

    Args:
        model: the `DiffusionGemmaForBlockDiffusion`.
        cache: the shared cache (a new one, or the caller's `past_key_values` holding an earlier prefix).
        keep: [B, all slots] bool padding vector, or None without padding.
        images: the prompt's image soft tokens (`PromptImages`), encoded with the prompt, or None.
        denoise_pass: the compiled fixed-shape decoder + head (`modeling.compile.DenoisePass`), or None (eager).
        samples: which rows sample in a denoising pass: `samples(row) -> bool` (the lock-step policy decides).
    """

    def __init__(self, model, cache, keep, images, denoise_pass, samples):
        self.model, self.cache, self.keep, self.images = model, cache, keep, images
        self.denoise_pass, self.samples = denoise_pass, samples
        if keep is not None:  # where the padding is: read to the host once, here, so no pass has to
            cache.padding = PaddingSlots.of(keep, cache.padding)

    def __call__(self, active: list) -> Forward:
        phase = active[0].phase
        if phase != DENOISE:  # 1. the padded prompt (with its images), or 5. the canvases committed last round
            tokens = torch.stack([r.tokens for r in active])  # [B, P] or [B, L]
            self.model.encode(tokens, self.cache, keep=self.keep, images=self.images if phase == PREFILL else None)
            return Forward([], None, list(active))
        canvas = torch.stack([r.tokens for r in active])  # [B, L]
        soft = shared_soft(active)  # [B, L, H] or None
        sampled = [i for i, r in enumerate(active) if self.samples(r)]
        pick = ((lambda t: t) if len(sampled) == len(active)
                else (lambda t: t[device_tensor(sampled, torch.long, t.device)]))
        if not sampled:
            return Forward([], None, [])
        if self.denoise_pass is not None:  # compiled: decoder + head over all B rows, the same shapes every step
            logits = self.denoise_pass(canvas, self.cache, soft, self.keep)  # [B, L, V] fp32
            return Forward(sampled, None, [], logits=pick(logits))
        hidden = self.model.denoise(canvas, self.cache, soft, keep=self.keep)  # [B, L, H]
        return Forward(sampled, pick(hidden), [])

    def reset(self, slot: int) -> None:
        """Rows join a lock-step batch once, together; their slots are never reused."""

    def move(self, src: int, dst: int) -> None:
        """Lock-step rows leave together: nothing moves."""


def shared_soft(active: list) -> torch.Tensor | None:
    """[B, L, H] the rows' self-conditioning inputs; a row without one yet (a row that did not sample) gets zeros,
    which is the first step's input (spec C.9). None when no row has one (the first step of a canvas)."""
    have = [r.soft for r in active if r.soft is not None]
    if not have:
        return None
    zeros = torch.zeros_like(have[0])
    return torch.stack([r.soft.to(have[0].dtype) if r.soft is not None else zeros for r in active])
