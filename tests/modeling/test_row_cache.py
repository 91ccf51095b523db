"""Mixed-phase passes (`RowCache` + `build_row_masks` + `run_rows`): each row of one shared forward computes what its
own encode/denoise would compute alone, whatever phase and length the other rows are at."""

import pytest
import torch

from conftest import tiny_config, tiny_model
from diffusiongemma.modeling.cache import RowCache

pytestmark = pytest.mark.usefixtures("one_thread", "no_grad")
L = 16


@pytest.fixture
def no_grad():
    with torch.no_grad():
        yield


class Alone:
    """One row run through the ordinary encode/denoise path with its own BlockDiffusionCache."""

    def __init__(self, model):
        self.model, self.cache = model, model.new_cache()

    def encode(self, ids):
        return self.model.encode(ids[None], self.cache)[0]

    def denoise(self, canvas, soft):
        return self.model.denoise(canvas[None], self.cache, None if soft is None else soft[None])[0]


def run(model, cache, rows):
    """rows: list of (kind, ids, soft) with kind "enc" or "dec" -> hidden per row, trimmed to its tokens."""
    T = max(len(ids) for _, ids, _ in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (_, ids, _) in enumerate(rows):
        tokens[i, : len(ids)] = ids
    q_lens = [len(ids) for _, ids, _ in rows]
    encoder_rows = [kind == "enc" for kind, _, _ in rows]
    soft_rows = [i for i, (kind, _, soft) in enumerate(rows) if soft is not None]
    soft = torch.stack([rows[i][2] for i in soft_rows]) if soft_rows else None
    hidden = model.run_rows(tokens, cache, q_lens, encoder_rows, soft, soft_rows)
    return [hidden[i, : len(ids)] for i, (_, ids, _) in enumerate(rows)]


@pytest.mark.parametrize("attn", ["sdpa", "eager", "flex_attention"])
@pytest.mark.parametrize("bidirectional", [None, "all"])
def test_rows_in_different_phases_match_running_alone(attn, bidirectional):
    config = tiny_config(use_bidirectional_attention=bidirectional) if bidirectional else tiny_config()
    config._attn_implementation = attn
    model = tiny_model(config)
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, 128, (n,), generator=g)  # noqa: E731
    soft = lambda: torch.randn(L, 64, generator=g)  # noqa: E731
    a, b, c = Alone(model), Alone(model), Alone(model)
    cache = RowCache(model.model.decoder.shapes, batch=3, capacity=128)
    pa, pb, pc = ids(5), ids(11), ids(3)  # prompts longer and shorter than the window 8
    ca, cb, cc, sb = ids(L), ids(L), ids(L), soft()
    # pass 1: three prefills of different lengths
    got = run(model, cache, [("enc", pa, None), ("enc", pb, None), ("enc", pc, None)])
    want = [a.encode(pa), b.encode(pb), c.encode(pc)]
    # pass 2: first denoising steps, one with self-conditioning
    got += run(model, cache, [("dec", ca, None), ("dec", cb, sb), ("dec", cc, None)])
    want += [a.denoise(ca, None), b.denoise(cb, sb), c.denoise(cc, None)]
    # pass 3: row a commits while b denoises and c commits; 4: a denoises its second canvas while b commits
    sa = soft()
    got += run(model, cache, [("enc", ca, None), ("dec", cb, sb), ("enc", cc, None)])
    want += [a.encode(ca), b.denoise(cb, sb), c.encode(cc)]
    got += run(model, cache, [("dec", cb, sa), ("enc", cb, None), ("dec", ca, None)])
    want += [a.denoise(cb, sa), b.encode(cb), c.denoise(ca, None)]
    assert cache.lengths == [5 + L, 11 + L, 3 + L]
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, atol=1e-4, rtol=1e-4)  # batching noise only: one row alone is exact


def test_move_and_reset_compact_the_pool():
    model = tiny_model()
    cache = RowCache(model.model.decoder.shapes, batch=2, capacity=64)
    p0, p1, canvas = torch.arange(3, 10), torch.arange(20, 24), torch.arange(40, 40 + L)
    run(model, cache, [("enc", p0, None), ("enc", p1, None)])
    cache.move(1, 0)  # row 0 leaves; row 1 takes its place
    alone = Alone(model)
    alone.encode(p1)
    (got,) = run(model, cache, [("dec", canvas, None)])
    torch.testing.assert_close(got, alone.denoise(canvas, None), atol=1e-5, rtol=1e-5)
    cache.reset(0)
    assert cache.lengths[0] == 0


def test_pass_longer_than_capacity_is_refused():
    model = tiny_model()
    cache = RowCache(model.model.decoder.shapes, batch=1, capacity=8)
    with pytest.raises(ValueError, match="cache holds 8"):
        run(model, cache, [("enc", torch.arange(3, 12), None)])
