"""Mixed-phase batching (generation/mixed.py): rows commit on their own, finished rows leave, a pool smaller than the
batch is refilled, and every row's output equals running it alone and equals lock-step batching."""

import pytest
import torch
from transformers import LogitsProcessor, StoppingCriteria

from conftest import tiny_model
from sync_count import count_host_syncs

pytestmark = pytest.mark.usefixtures("one_thread")
L = 16
# with the sharpened model below, these settings make rows stop after 2 to 10 steps
KW = dict(max_new_tokens=48, max_denoising_steps=10, pad_token_id=0, stability_threshold=0, confidence_threshold=0.8,
          return_dict_in_generate=True)


@pytest.fixture(scope="module")
def model():
    """A tiny model with logits sharp enough that rows converge at different steps (random ones stay uniform)."""
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # tied with the embedding
    return model


def prompts(batch: int, length: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


class PassLog:
    """Wraps model.run_rows to record (rows, encoder rows) of every mixed-phase pass."""

    def __init__(self, model, monkeypatch):
        self.passes = []
        inner = model.run_rows

        def run_rows(tokens, cache, q_lens, encoder_rows, *args):
            self.passes.append((len(tokens), sum(encoder_rows)))
            return inner(tokens, cache, q_lens, encoder_rows, *args)

        monkeypatch.setattr(model, "run_rows", run_rows)


SETTINGS = [dict(), dict(eos_token_id=7), dict(stability_threshold=1, confidence_threshold=2.0),
            dict(confidence_threshold=1e-9)]


@pytest.mark.parametrize("settings", SETTINGS)
def test_mixed_equals_lockstep_and_running_alone(model, settings):
    ids, kw = prompts(4), dict(KW, **settings)
    mixed = model.generate(ids, sampling="fast", seed=11, batching="mixed", **kw)
    lock = model.generate(ids, sampling="fast", seed=11, batching="lockstep", **kw)
    assert torch.equal(mixed.sequences, lock.sequences)
    torch.testing.assert_close(mixed.tokens_per_forward, lock.tokens_per_forward)
    for r in range(4):
        alone = model.generate(ids[r : r + 1], sampling="fast", seed=[11 + r], **kw).sequences[0]
        assert torch.equal(mixed.sequences[r, : len(alone)], alone)
        assert bool((mixed.sequences[r, len(alone) :] == 0).all())


def test_rows_commit_independently_and_leave(model, monkeypatch):
    log = PassLog(model, monkeypatch)
    out = model.generate(prompts(4), sampling="fast", seed=3, **KW)  # mixed is the fast-mode default
    assert out.sequences.shape == (4, 6 + 3 * L)
    assert log.passes[0] == (4, 4)  # one prefill pass for the whole pool
    assert any(0 < enc < rows for rows, enc in log.passes)  # a commit shared a forward with denoising rows
    assert log.passes[-1][0] < 4  # finished rows left the batch
    passes = (out.sequences[:, 6:] != 0).sum(-1) / out.tokens_per_forward  # denoising passes per row
    assert len(set(passes.round().tolist())) > 1  # the rows really progressed at different speeds
    # every row-pass did work: prefill + denoising passes + commits of all but the last canvas
    assert sum(rows for rows, _ in log.passes) == int(passes.round().sum()) + 4 + 4 * 2


def test_pool_smaller_than_batch_is_refilled(model, monkeypatch):
    ids = prompts(5, seed=2)
    full = model.generate(ids, sampling="fast", seed=0, **KW).sequences
    log = PassLog(model, monkeypatch)
    pooled = model.generate(ids, sampling="fast", seed=0, max_batch_size=2, **KW).sequences
    assert torch.equal(pooled, full)
    assert max(rows for rows, _ in log.passes) == 2
    chunks = model.generate(ids, sampling="fast", seed=0, batching="lockstep", max_batch_size=2, **KW).sequences
    assert torch.equal(chunks, full)


def test_mixed_needs_fewer_row_passes_than_lockstep(model, monkeypatch):
    ids = prompts(4, seed=5)
    log = PassLog(model, monkeypatch)
    model.generate(ids, sampling="fast", seed=1, max_batch_size=2, **KW)
    mixed_rows = sum(rows for rows, _ in log.passes)
    calls = []
    monkeypatch.setattr(model, "denoise", lambda canvas, *a, **k: calls.append(len(canvas)) or
                        type(model).denoise(model, canvas, *a, **k))
    model.generate(ids, sampling="fast", seed=1, batching="lockstep", max_batch_size=2, **KW)
    assert mixed_rows < sum(calls) + 3 * 4  # lock-step: denoising row-passes + prefill and commits of every row


def test_padded_rows_equal_their_unpadded_prompt_alone(model):
    short, long_ = prompts(1, 3, seed=1)[0], prompts(1, 9, seed=2)[0]
    ids = torch.stack([torch.cat([torch.zeros(6, dtype=torch.long), short]), long_])
    mask = (torch.arange(9) >= torch.tensor([[6], [0]])).long()
    out = model.generate(ids, attention_mask=mask, sampling="fast", seed=[4, 8], **KW).sequences
    assert torch.equal(out[:, :9], ids)  # the prompt comes back as given, padding included
    for row, (prompt, seed) in enumerate([(short, 4), (long_, 8)]):
        alone = model.generate(prompt[None], sampling="fast", seed=[seed], **KW).sequences[0, len(prompt) :]
        assert torch.equal(out[row, 9 : 9 + len(alone)], alone)


class BanToken(LogitsProcessor):
    def __call__(self, input_ids, scores):
        scores[..., 5] = -float("inf")
        return scores


class StopAfterOneCanvas(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 6 + L, dtype=torch.bool)


def test_processors_criteria_and_seeded_first_canvas_match_lockstep(model):
    ids = prompts(3, seed=4)
    g = torch.Generator().manual_seed(0)
    kw = dict(KW, logits_processor=[BanToken()], decoder_input_ids=torch.randint(3, 128, (3, L), generator=g),
              self_conditioning_logits=torch.randn(3, L, 128, generator=g))
    mixed = model.generate(ids, sampling="fast", seed=2, **kw).sequences
    assert not bool((mixed[:, 6:] == 5).any())
    assert torch.equal(mixed, model.generate(ids, sampling="fast", seed=2, batching="lockstep", **kw).sequences)
    stopped = model.generate(ids, sampling="fast", seed=2, stopping_criteria=[StopAfterOneCanvas()], **KW).sequences
    assert stopped.shape == (3, 6 + L)


def test_bad_batching_arguments(model):
    ids = prompts(2)
    with pytest.raises(ValueError, match="`batching` must be one of"):
        model.generate(ids, sampling="fast", batching="continuous", **KW)
    with pytest.raises(ValueError, match="need sampling='fast'"):
        model.generate(ids, batching="mixed", **KW)
    with pytest.raises(ValueError, match="need sampling='fast'"):
        model.generate(ids, max_batch_size=1, **KW)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="`max_batch_size` must be a positive int"):
            model.generate(ids, sampling="fast", max_batch_size=bad, **KW)
    # an empty cache continues nothing (mixed continues a real one: test_mixed_continues_past_key_values_...)
    plain = model.generate(ids, sampling="fast", seed=0, batching="mixed", **KW).sequences
    empty = model.generate(ids, sampling="fast", seed=0, batching="mixed", past_key_values=model.new_cache(), **KW)
    assert torch.equal(empty.sequences, plain)
    cache = model.generate(prompts(3), sampling="fast", seed=0, batching="lockstep", **KW).past_key_values
    with pytest.raises(ValueError, match=r"`past_key_values` holds 3 rows, `input_ids` 2"):
        model.generate(ids, sampling="fast", batching="mixed", past_key_values=cache, **KW)
    with pytest.raises(ValueError, match=r"marks every token of batch rows \[1\] as padding"):
        model.generate(ids, attention_mask=torch.tensor([[1] * 6, [0] * 6]), sampling="fast", **KW)


class SyncsPerPass:
    """Counts host syncs (tests/sync_count.py) between consecutive mixed-phase passes (each `run_rows` call starts
    one) and inside each forward."""

    def __init__(self, model, monkeypatch, syncs):
        self.marks, self.forward = [], []
        inner = model.run_rows

        def run_rows(*args):
            self.marks.append(syncs.total)
            hidden = inner(*args)
            self.forward.append(syncs.total - self.marks[-1])
            return hidden

        monkeypatch.setattr(model, "run_rows", run_rows)

    def per_pass(self, end: int) -> list[int]:
        """Syncs from each pass's start to the next one's (the last one: to `end`)."""
        return [b - a for a, b in zip(self.marks, self.marks[1:] + [end])]


@pytest.mark.parametrize("settings", [dict(), dict(eos_token_id=7, max_batch_size=2)])
def test_a_scheduler_pass_reads_the_device_at_most_once(model, monkeypatch, settings):
    with count_host_syncs() as syncs:
        counter = SyncsPerPass(model, monkeypatch, syncs)
        model.generate(prompts(4), sampling="fast", seed=3, **dict(KW, **settings))
        end = syncs.total
    assert len(counter.marks) > 10
    assert set(counter.forward) == {0}, counter.forward  # the shared forward itself never syncs
    assert max(counter.per_pass(end)) <= 1, (counter.per_pass(end), syncs.calls)


def test_user_criteria_add_one_read_when_a_canvas_ends(model, monkeypatch):
    with count_host_syncs() as syncs:
        counter = SyncsPerPass(model, monkeypatch, syncs)
        model.generate(prompts(3), sampling="fast", seed=2, stopping_criteria=[StopAfterOneCanvas()], **KW)
        end = syncs.total
    per_pass = counter.per_pass(end)
    assert max(per_pass) == 2 and per_pass.count(2) <= 3, per_pass  # at most one per row: its first canvas ends


class RoundRecorder:
    def __init__(self):
        self.calls = []

    def put(self, value):
        self.calls.append(("put", value.clone()))

    def put_draft(self, value=None, logits=None):
        self.calls.append(("draft", value.clone()))

    def end(self):
        self.calls.append(("end", None))


def test_a_streamer_follows_a_mixed_batch_round_by_round(model):
    """Rows of a mixed batch commit in different passes; the streamer (an observer of the pool's events) still gets
    the prompt, [B, L] drafts, and canvas c of every row once all rows committed it (pad for finished rows), so
    the committed rounds are exactly the output's canvases; and streaming changes no token."""
    ids = prompts(3)
    kw = dict(KW, eos_token_id=7)
    plain = model.generate(ids, sampling="fast", seed=[5, 9, 2], batching="mixed", **kw).sequences
    streamer = RoundRecorder()
    out = model.generate(ids, sampling="fast", seed=[5, 9, 2], batching="mixed", streamer=streamer, **kw).sequences
    assert torch.equal(out, plain)
    kinds = [k for k, _ in streamer.calls]
    assert kinds[0] == "put" and kinds[-1] == "end" and "draft" in kinds
    assert torch.equal(streamer.calls[0][1], ids)
    rounds = [v for k, v in streamer.calls[1:] if k == "put"]
    assert all(r.shape == (3, L) for r in rounds)
    assert torch.equal(torch.cat(rounds, dim=1), out[:, ids.shape[1]:])
    assert all(v.shape == (3, L) for k, v in streamer.calls if k == "draft")


def collapse(values: list) -> list:
    """Consecutive repeats dropped."""
    return [v for i, v in enumerate(values) if i == 0 or not torch.equal(v, values[i - 1])]


def test_mixed_draft_streaming_shows_each_rows_own_steps(model):
    """Draft streaming (`put_draft`) with mixed batching, rows arriving and leaving (2 slots, 3 rows): every draft is
    [B, L], and row b's column, repeats dropped, is the argmax of each of its own steps in order (its trace's
    records), after the fill while it waits for a slot."""
    ids = prompts(3)
    kw = dict(KW, eos_token_id=7)
    streamer = RoundRecorder()
    out = model.generate(ids, sampling="fast", seed=[5, 9, 2], batching="mixed", max_batch_size=2, streamer=streamer,
                         return_trace=True, trace_top_k=2, **kw)
    drafts = [v for k, v in streamer.calls if k == "draft"]
    assert drafts and all(d.shape == (3, L) for d in drafts)
    trace = out.trace
    for b in range(3):
        column = collapse([d[b] for d in drafts])
        waited = torch.equal(column[0], torch.zeros(L, dtype=torch.long))  # the fill, before row b's first step
        assert waited == (b == 2)  # row 2 waits for a free slot: drafts of the others come first
        column = column[1:] if waited else column
        steps = collapse([a.long() for a in trace.tensors["argmax"][trace.tensors["row_index"] == b][:, 0]])
        assert len(column) == len(steps) and all(torch.equal(x, y) for x, y in zip(column, steps))


def test_mixed_continues_past_key_values_as_lockstep_does(model):
    """`past_key_values` from a lock-step call (no padding): each mixed row's cache starts from its row of the shared
    cache, so the continuation equals lock-step's (rows arriving through 2 slots, batch-invariant, compiled), and the
    shared cache is only read."""
    import copy

    first = model.generate(prompts(3), sampling="fast", seed=1, batching="lockstep", return_dict_in_generate=True,
                           max_new_tokens=32, max_denoising_steps=10, pad_token_id=0)
    cache = first.past_key_values
    before = [k[:, :, : cache.length].clone() for k in cache.keys]
    more, kw = prompts(3, length=4, seed=1), dict(KW, eos_token_id=7)
    lock = model.generate(more, past_key_values=copy.deepcopy(cache), sampling="fast", seed=5, batching="lockstep",
                          **kw).sequences
    alone = model.generate(more, sampling="fast", seed=5, batching="mixed", **kw).sequences
    assert not torch.equal(lock, alone)  # the prefix matters
    for extra in (dict(), dict(max_batch_size=2), dict(batch_invariant=True),
                  dict(max_batch_size=1, compile={"backend": "eager"})):
        out = model.generate(more, past_key_values=cache, sampling="fast", seed=5, batching="mixed", **kw, **extra)
        assert torch.equal(out.sequences, lock), extra
        assert out.past_key_values is None  # mixed returns no cache
    assert cache.length == first.sequences.shape[1] - 16 and all(
        torch.equal(k[:, :, : cache.length], b) for k, b in zip(cache.keys, before))


def test_mixed_refuses_a_padded_prefix_saying_why(model):
    ids = prompts(2)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    first = model.generate(ids, attention_mask=mask, sampling="fast", seed=1, batching="lockstep",
                           return_dict_in_generate=True, max_new_tokens=16, max_denoising_steps=4)
    more = prompts(2, length=3, seed=1)
    full_mask = torch.cat([mask, torch.ones(2, first.past_key_values.length - 6 + 3, dtype=mask.dtype)], dim=1)
    with pytest.raises(ValueError, match=r"batching='mixed' cannot run with past_key_values: the shared cache holds "
                                         r"left padding.*\(pass batching='lockstep'\)"):
        model.generate(more, attention_mask=full_mask, past_key_values=first.past_key_values, sampling="fast",
                       seed=0, batching="mixed", max_new_tokens=16, max_denoising_steps=4)
