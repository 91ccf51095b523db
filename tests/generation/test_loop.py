"""`generate` bookkeeping in fast mode: per-row seeds, row independence, skipped rows (generation/loop.py,
lockstep.py)."""

import pytest
import torch

from conftest import tiny_model

KW = dict(max_new_tokens=40, max_denoising_steps=5, pad_token_id=0)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def prompts(batch: int, length: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_fast_rows_do_not_depend_on_the_rest_of_the_batch(model):
    ids = prompts(3)
    # eos 7 makes rows finish at different canvases: finished rows are skipped and must not disturb the others
    kw = dict(KW, eos_token_id=7)
    batch = model.generate(ids, sampling="fast", seed=[5, 9, 2], **kw).sequences
    for row, seed in enumerate([5, 9, 2]):
        alone = model.generate(ids[row : row + 1], sampling="fast", seed=[seed], **kw).sequences[0]
        n = alone.shape[0]
        assert torch.equal(batch[row, :n], alone)
        assert bool((batch[row, n:] == 0).all())  # the batch only adds padding after the row finished


def test_fast_seed_and_generator_fix_the_output(model):
    ids = prompts(2)
    a = model.generate(ids, sampling="fast", seed=3, **KW).sequences
    b = model.generate(ids, sampling="fast", seed=[3, 4], **KW).sequences  # int seed s -> rows s, s + 1
    c = model.generate(ids, sampling="fast", seed=[4, 4], **KW).sequences
    assert torch.equal(a, b) and not torch.equal(a, c)
    gens = [torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    assert torch.equal(model.generate(ids, sampling="fast", generator=gens, **KW).sequences, a)
    torch.manual_seed(1)
    d = model.generate(ids, sampling="fast", **KW).sequences
    torch.manual_seed(1)
    assert torch.equal(model.generate(ids, sampling="fast", **KW).sequences, d)


def count_steps(monkeypatch) -> list:
    """Patch the lock-step policy's denoising pass to record, per pass, the rows that ran the engine."""
    from diffusiongemma.generation.lockstep import Lockstep

    calls, real = [], Lockstep.denoise
    monkeypatch.setattr(Lockstep, "denoise", lambda self, pool, rows, out, events: calls.append(list(out.sampled))
                        or real(self, pool, rows, out, events))
    return calls


def test_fast_counts_passes_only_for_working_rows(model, monkeypatch):
    """A row's passes are the steps it ran: exactly the steps it takes alone (fast rows are independent), although
    the batch runs more steps than some rows (rows that stopped denoising or finished are not counted)."""
    ids = prompts(3)
    kw = dict(KW, eos_token_id=7, batching="lockstep", return_dict_in_generate=True)
    seeds = [5, 9, 2]
    alone = []
    for row, seed in enumerate(seeds):
        calls = count_steps(monkeypatch)
        model.generate(ids[row : row + 1], sampling="fast", seed=[seed], **kw)
        alone.append(len(calls))  # batch of 1: every step is a pass of that row
        monkeypatch.undo()
    calls = count_steps(monkeypatch)
    out = model.generate(ids, sampling="fast", seed=seeds, **kw)
    assert len(set(alone)) > 1 and len(calls) > min(alone)  # rows differ, and some steps skipped a row
    assert sum(len(rows) for rows in calls) == sum(alone)  # every pass ran exactly one working row's sampler
    new_tokens = (out.sequences[:, 6:] != 0).sum(dim=-1)  # [B] non-pad tokens
    expected = new_tokens / torch.tensor(alone, dtype=torch.int32)
    assert torch.equal(out.tokens_per_forward, expected), (out.tokens_per_forward, alone)


def test_lockstep_chunks_refuse_what_they_cannot_share(model):
    class Recorder:
        def put(self, value):
            pass

        def end(self):
            pass

    ids = prompts(3)
    with pytest.raises(ValueError, match=r"lock-step slices .* cannot run with streamer"):
        model.generate(ids, sampling="fast", batching="lockstep", max_batch_size=2, streamer=Recorder(), **KW)
    with pytest.raises(ValueError, match=r"cannot run with past_key_values: .*max_batch_size=None"):
        model.generate(ids, sampling="fast", max_batch_size=2, past_key_values=model.new_cache(), **KW)
    # chunks alone still run: each row's tokens are those of its chunk run alone
    seq = model.generate(ids, sampling="fast", batching="lockstep", max_batch_size=2, seed=[4, 5, 6], **KW).sequences
    assert torch.equal(seq[2:], model.generate(ids[2:], sampling="fast", seed=[6], **KW).sequences)


def test_reference_mode_rejects_seeds(model):
    with pytest.raises(ValueError, match="sampling='fast'"):
        model.generate(prompts(1), seed=1, **KW)
    with pytest.raises(ValueError, match="must be one of"):
        model.generate(prompts(1), sampling="greedy", **KW)


@pytest.mark.parametrize("sampling", ["fast", "reference"])
def test_compile_switch_compiles_one_graph_for_every_step_and_canvas_and_keeps_the_tokens(model, sampling):
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    seed = 0 if sampling == "fast" else None
    counter = CompileCounter()  # dynamo tracing with the eager backend: fast; test_static_compile.py runs inductor
    counters.clear()
    # the second call reuses the graph kept on the model; the third, with fewer new tokens, falls in the same
    # capacity bucket (prompt 6 + 3 or 2 canvases of 16 -> 64 slots)
    for new_tokens in (40, 40, 24):
        kw = dict(KW, max_new_tokens=new_tokens)
        torch.manual_seed(0)
        eager = model.generate(prompts(2), sampling=sampling, seed=seed, **kw).sequences
        torch.manual_seed(0)
        compiled = model.generate(prompts(2), sampling=sampling, seed=seed, compile={"backend": counter},
                                  batching="lockstep", **kw)  # unset, compile with per-row samplers runs mixed
        assert torch.equal(compiled.sequences, eager)
    assert counter.frame_count == 1 and not counters["graph_break"] and not counters["recompiles"]


def test_compile_switch_errors_name_the_argument(model):
    with pytest.raises(TypeError, match="`compile` must be a bool or a dict"):
        model.generate(prompts(1), compile="yes", **KW)
    with pytest.raises(ValueError, match=r"`compile` options \['dynamic'\]"):
        model.generate(prompts(1), compile={"dynamic": True}, **KW)
    with pytest.raises(ValueError, match="batch_invariant=True .* cannot run with compile"):  # mixed compiles now
        model.generate(prompts(2), sampling="fast", seed=0, batch_invariant=True, compile=True, **KW)


def test_a_row_with_nothing_to_sample_is_an_error_in_both_modes(model):
    """A processor that bans every token of one row: both modes raise the same clear error (the reference's
    multinomial refusal is translated; fast mode must not commit the NaN arithmetic's garbage)."""

    class BanRowOne:
        def __call__(self, input_ids, scores):
            scores[1] = float("-inf")
            return scores

    ids = prompts(2)
    with pytest.raises(ValueError, match=r"batch rows \[1\]: every token.s score is -inf"):
        model.generate(ids, sampling="fast", seed=0, batching="lockstep", logits_processor=[BanRowOne()], **KW)
    with pytest.raises(ValueError, match=r"batch rows \[1\]: every token.s score is -inf"):
        model.generate(ids, logits_processor=[BanRowOne()], **KW)
