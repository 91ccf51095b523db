"""Mixed-batch traces (accuracy/rows.py, the mixed parts of record.py and format.py): recorded one record per row and
step, replayed and checked row by row, each row as the independent sequence it was in the pool."""

import copy
import json

import pytest
import torch

from conftest import tiny_model
from diffusiongemma.accuracy import Trace, TraceFormatError, load_trace
from diffusiongemma.accuracy.checks import Tolerances, recorded_sampler_config, run_checks
from diffusiongemma.accuracy.replay import replay, replay_stopper
from diffusiongemma.accuracy.report import summarize
from diffusiongemma.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
V, L = 128, 16
# with the sharpened model below, rows stop after 2 to 10 steps; EOS 7 ends some rows after one canvas
KW = dict(max_new_tokens=48, max_denoising_steps=10, pad_token_id=0, stability_threshold=0, confidence_threshold=0.8,
          eos_token_id=7)


@pytest.fixture(scope="module")
def model():
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # tied with the embedding: sharp logits, rows converge at different steps
    return model


def padded_prompts():
    """4 prompts of lengths 7, 4, 7, 6 (left padding)."""
    ids = torch.randint(3, V, (4, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[3, :1] = 0
    return ids, mask


def mixed_trace(model, **extra):
    ids, mask = padded_prompts()
    out = model.generate(ids, attention_mask=mask, sampling="fast", seed=11, batching="mixed", max_batch_size=2,
                         return_trace=True, trace_top_k=V, **dict(KW, **extra))
    return ids, mask, out


def checks_of(model, trace):
    return run_checks(trace, recorded_sampler_config(trace.manifest), replay_stopper(trace, model), Tolerances())


def test_a_batch_invariant_mixed_trace_self_replays_exactly(model, tmp_path):
    """Rows arrive and leave (2 slots, 4 rows), have different prompt lengths and finish at different canvases; each
    row replays as its own sequence through the one plan builder: KL and |dlogp| exactly 0, every check passes."""
    ids, mask, out = mixed_trace(model, batch_invariant=True)
    trace = out.trace
    assert trace.is_mixed and trace.manifest["batching"] == "mixed" and trace.manifest["batch_invariant"]
    rows = trace.tensors["row_index"]
    assert rows.tolist() == sorted(rows.tolist()) and set(rows.tolist()) == {0, 1, 2, 3}
    assert trace.tensors["topk_ids"].shape[1] == 1  # one row per record
    canvases = {b: int(trace.tensors["canvas_index"][rows == b].max()) + 1 for b in range(4)}
    assert len(set(canvases.values())) > 1, canvases  # rows finished at different canvases
    for b in range(4):  # each row is the one-row trace of its own sequence: prompt without padding, its canvases
        one = trace.row(b)
        prompt = ids[b][mask[b].bool()]
        assert one.prompt_length == len(prompt) and one.num_canvases == canvases[b]
        assert torch.equal(one.tensors["sequences"][0].long(), out.sequences[b, 7 - len(prompt):][: len(prompt)
                                                                                                   + canvases[b] * L])
    trace.save(tmp_path / "t")
    loaded = load_trace(tmp_path / "t")
    scores = replay(model, loaded)
    assert sorted({s.row for s in scores}) == [0, 1, 2, 3] and len(scores) == len(rows)
    assert {s.top1 for s in scores} == {1.0} and {s.accepted for s in scores} == {1.0}
    assert {s.stop for s in scores} == {1.0}
    assert max(s.kl for s in scores) == 0.0 and max(s.max_dlogprob for s in scores) == 0.0
    verdicts = checks_of(model, loaded)
    assert {n: r.status for n, r in verdicts.items()} == {n: "pass" for n in verdicts}
    assert verdicts["commit"].checked == sum(canvases.values())
    assert summarize(scores, False, 0.99, 0.01, verdicts)["passed"]


def test_a_mixed_trace_records_what_generate_returns(model):
    ids, mask, out = mixed_trace(model)
    plain = model.generate(ids, attention_mask=mask, sampling="fast", seed=11, batching="mixed", max_batch_size=2,
                           return_dict_in_generate=True, **KW)
    assert torch.equal(out.sequences, plain.sequences)  # recording changes no token
    t = out.trace.tensors
    for b in range(4):  # the last step of each canvas of a row holds what it committed
        one = out.trace.row(b)
        for c in range(one.num_canvases):
            last = one.steps(c)[-1]
            committed = one.committed(c)[0]
            argmax = one.tensors["argmax"][last, 0]
            upto = committed != 0
            assert torch.equal(committed[upto], argmax[upto])
    assert bool(t["active"].all())
    first = t["step_index"] == 0
    assert not bool(t["sc_present"][first].any()) and bool(t["sc_present"][~first].all())


def test_mixed_checks_name_the_row_that_broke(model):
    _, _, out = mixed_trace(model)
    trace = copy.deepcopy(out.trace)
    rows = trace.tensors["row_index"]
    r = int(torch.nonzero(rows == 2)[1])  # row 2's second record
    trace.tensors["accepted"][r, 0] = ~trace.tensors["accepted"][r, 0]
    trace.tensors["temperature"][r] += 0.5
    verdicts = checks_of(model, trace)
    assert verdicts["acceptance"].status == "fail" and verdicts["acceptance"].first.row == 2
    assert verdicts["temperature"].status == "fail" and verdicts["temperature"].first.row is None  # a whole step
    assert verdicts["commit"].status == "pass"


def test_malformed_mixed_traces_name_the_problem(model):
    _, _, out = mixed_trace(model)
    good = out.trace

    def broken(**edits):
        t = dict(good.tensors)
        t.update(edits)
        return Trace(dict(good.manifest), t)

    rows = good.tensors["row_index"]
    cases = [
        (dict(row_index=rows.flip(0)), "`row_index` must be non-decreasing"),
        (dict(row_index=rows + 4), r"`row_index` must lie in \[0, 4\)"),
        (dict(row_index=rows.long()), "`row_index` must be torch.int32"),
        (dict(active=torch.ones(len(rows), 4, dtype=torch.bool)), "`active` has B = 4"),
    ]
    for edits, message in cases:
        with pytest.raises(TraceFormatError, match=message):
            from diffusiongemma.accuracy.format import validate

            validate(broken(**edits))
    minimal = Trace(dict(good.manifest), {"sequences": good.tensors["sequences"], "row_index": rows})
    with pytest.raises(TraceFormatError, match="`row_index` names the row of each step record: it needs a full"):
        from diffusiongemma.accuracy.format import validate

        validate(minimal)


def test_a_lockstep_trace_has_no_rows(model):
    ids, mask = padded_prompts()
    out = model.generate(ids, attention_mask=mask, sampling="fast", seed=11, batching="lockstep", return_trace=True,
                         trace_top_k=4, **KW)
    assert not out.trace.is_mixed and out.trace.tensors["topk_ids"].shape[1] == 4
    assert out.trace.manifest["batching"] == "lockstep" and not out.trace.manifest["batch_invariant"]
    assert {s.row for s in replay(model, out.trace)} == {None}


def test_trace_and_compare_cli_with_mixed_batching(saved_pair, tmp_path, capsys):
    """`diffusiongemma trace --sampling fast --batching mixed` writes a mixed trace that `compare` passes, as a
    lock-step self-replay does (top-1, acceptance and stop agree everywhere, KL < 1e-5, every check passes)."""
    path = saved_pair[0]
    (tmp_path / "prompts.txt").write_text("Hello there\nA longer prompt, padded\nthird\n")
    trace = ["trace", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--max-new-tokens", "48",
             "--steps", "4", "--seed", "5", "--top-k", str(V), "--sampling", "fast"]
    assert main([*trace, "--out", str(tmp_path / "t"), "--batching", "mixed"]) == 0
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["batching"] == "mixed" and manifest["row_seeds"] == [5, 6, 7]
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    steps = summary["steps"]
    assert summary["passed"] and {s["row"] for s in steps} == {0, 1, 2}
    assert {s["top1"] for s in steps} == {1.0} and {s["accepted"] for s in steps} == {1.0}
    assert {s["stop"] for s in steps} == {1.0} and max(s["kl"] for s in steps) < 1e-5
    # float rounding between the pool's pass shapes and the replay's one-row shapes (batch_invariant: exactly 0)
    assert max(s["max_dlogprob"] for s in steps) < 1e-4
    assert {n: c["status"] for n, c in summary["checks"].items()} == {n: "pass" for n in summary["checks"]}
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("  row canvas  step") and table[1].split()[:2] == ["0", "0"] and "PASS" in table[-1]
    # reference sampling draws from the global RNG over one lock-step batch: refused before the model loads
    assert main([*trace[:-2], "--out", str(tmp_path / "r"), "--batching", "mixed"]) == 2
    assert "--batching mixed needs --sampling fast" in capsys.readouterr().err


@pytest.mark.parametrize("config_name", ["EntropyBoundSamplerConfig", "BlockRefinementSamplerConfig",
                                         "ConfidenceThresholdSamplerConfig", "DiscreteDDIMSamplerConfig"])
def test_every_sampler_s_mixed_trace_passes_its_checks_and_replays_exactly(config_name):
    """The sudoku demo model (trained: its steps converge), 3 puzzles through 2 slots with batch_invariant: each
    sampler's mixed trace passes every algorithm check it has (its own acceptance rule, the draws it records) and
    self-replays exactly, row by row."""
    import random

    import diffusiongemma.generation.sampler as samplers
    from diffusiongemma.sudoku import make_puzzle
    from diffusiongemma.sudoku.demo import DEMO_MODEL, load_demo_model
    from diffusiongemma.sudoku.tokenizer import encode_puzzle

    if not (DEMO_MODEL / "model.safetensors").exists():
        pytest.skip("no bundled model")
    model, tokenizer = load_demo_model()
    rng = random.Random(0)
    ids = torch.tensor([encode_puzzle(tokenizer, make_puzzle(rng, 45)[0]) for _ in range(3)])
    config = (model.generation_config.sampler_config if config_name == "EntropyBoundSamplerConfig"  # the model's own
              else getattr(samplers, config_name)())
    assert type(config).__name__ == config_name
    trace = model.generate(ids, max_denoising_steps=8, return_trace=True, trace_top_k=4, sampling="fast", seed=1,
                           batching="mixed", max_batch_size=2, batch_invariant=True, sampler_config=config).trace
    assert trace.is_mixed and set(trace.tensors["row_index"].tolist()) == {0, 1, 2}
    assert ("draw_ids" in trace.tensors) == (config_name != "EntropyBoundSamplerConfig")  # they draft every position
    verdicts = checks_of(model, trace)
    assert [n for n, r in verdicts.items() if r.status == "fail"] == []
    if config_name != "DiscreteDDIMSamplerConfig":
        assert verdicts["acceptance"].status == "pass" and verdicts["acceptance"].checked > 0
    scores = replay(model, trace)
    assert {s.top1 for s in scores} == {1.0} and max(s.kl for s in scores) == 0.0


def test_kl_positions_of_a_mixed_trace_row_by_row(model):
    """`diffusiongemma kl` reads the base's trace; a mixed one (a per-row sampler, several prompts) is compared row
    by row: the model against itself gives KL 0 at every position of every row."""
    from diffusiongemma.accuracy.kl import positions_of

    _, _, out = mixed_trace(model, trace_sc_embedding=True)
    got = positions_of(model, model, out.trace)
    assert set(got["row"].tolist()) == {0, 1, 2, 3}
    assert len(got["kl"]) == L * len(out.trace.tensors["row_index"])
    assert float(got["kl"].max()) < 1e-6 and bool(got["same_top1"].all())


def test_a_compiled_mixed_trace_self_replays(model):
    """compile=True runs mixed passes through the fixed-shape row pass; its trace is recorded the same way and
    replays row by row (backend "eager": the graph capture without inductor's compile time)."""
    ids, mask = padded_prompts()
    kw = dict(KW, sampling="fast", seed=3, max_batch_size=2, return_trace=True, trace_top_k=V)
    compiled = model.generate(ids, attention_mask=mask, compile={"backend": "eager"}, **kw)
    eager = model.generate(ids, attention_mask=mask, **kw)
    assert compiled.trace.is_mixed and torch.equal(compiled.sequences, eager.sequences)
    scores = replay(model, compiled.trace)
    assert {s.top1 for s in scores} == {1.0} and max(s.kl for s in scores) < 1e-5
