"""Trace recording (`generate(..., return_trace=True)`) and the trace files (accuracy/record.py, accuracy/format.py)."""

import json

import pytest
import torch
from conftest import tiny_model

import diffusiongemma
from diffusiongemma.accuracy import Trace, TraceFormatError, load_trace
from diffusiongemma.accuracy.record import top_k_logprobs
from diffusiongemma.generation.entropy_bound import entropy_bound_accept, temperature_at

STEPS = 4


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def traced(model, ids, global_seed=3, **kwargs):
    torch.manual_seed(global_seed)
    return model.generate(ids, max_new_tokens=32, max_denoising_steps=STEPS, return_trace=True, **kwargs)


def test_top_k_logprobs_worked_example():
    # logits [0, ln 3] -> p = (1/4, 3/4): the top-1 is id 1 with log 0.75
    ids, lp = top_k_logprobs(torch.tensor([[0.0, float(torch.tensor(3.0).log())]]), 1)
    assert ids.tolist() == [[1]] and lp.item() == pytest.approx(-0.28768, abs=1e-5)


def test_trace_holds_every_step_and_matches_the_output(model, one_thread):
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    out = traced(model, ids)
    t = out.trace.tensors
    torch.manual_seed(3)
    plain = model.generate(ids, max_new_tokens=32, max_denoising_steps=STEPS)
    assert torch.equal(plain.sequences, out.sequences)  # recording changes nothing
    assert out.trace.num_canvases == 2 and torch.equal(t["sequences"].long(), out.sequences)
    R = t["canvas_index"].shape[0]
    assert t["input_canvas"].shape == (R, 2, 16) and t["topk_ids"].shape == (R, 2, 16, 8)
    for c in range(2):
        records = out.trace.steps(c)
        last = records[-1]
        # the committed canvas is the last step's argmax (no EOS in this tiny run)
        assert torch.equal(t["argmax"][last], out.trace.committed(c))
        assert t["step_index"][records].tolist() == list(range(len(records)))
        # temperatures follow the schedule with n = N..1 steps remaining
        expected = [float(temperature_at(STEPS - s, STEPS, 0.4, 0.8)) for s in range(len(records))]
        assert t["temperature"][records].tolist() == pytest.approx(expected)
        # the first step has no self-conditioning; step s uses step s-1's distribution
        assert not t["sc_present"][records[0]].any()
        for a, b in zip(records[:-1].tolist(), records[1:].tolist()):
            assert torch.equal(t["sc_ids"][b], t["topk_ids"][a])
            # the step's input canvas is accepted samples + noise: where accepted, not necessarily the argmax, but
            # the accepted mask follows the entropy-bound rule on the recorded entropies
        assert torch.equal(t["accepted"][records], entropy_bound_accept(t["entropy"][records], 0.1))
    # argmax is the top-1 of the recorded distribution
    assert torch.equal(t["argmax"], t["topk_ids"][..., 0])


def test_trace_is_identical_run_to_run_and_survives_save_and_load(model, tmp_path, one_thread):
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    a, b = traced(model, ids).trace, traced(model, ids).trace
    assert a.tensors.keys() == b.tensors.keys()
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    a.save(tmp_path / "t")
    back = diffusiongemma.load_trace(tmp_path / "t")
    assert all(torch.equal(a.tensors[k], back.tensors[k]) for k in a.tensors)
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["format"] == "diffusiongemma-trace" and manifest["seed"] == 3 and manifest["top_k"] == 8
    assert manifest["generation_config"]["max_denoising_steps"] == STEPS
    assert manifest["generation_config"]["sampler_config"] == {"entropy_bound": 0.1, "_cls_name": "EntropyBoundSamplerConfig"}
    assert set(manifest["versions"]) == {"diffusiongemma", "torch", "transformers"}
    assert len(manifest["model"]["config_sha256"]) == 64 and manifest["dtype"] == "float32"
    c = traced(model, ids, global_seed=4).trace  # another seed, another trace
    assert not torch.equal(a.tensors["input_canvas"], c.tensors["input_canvas"])


def test_fast_lockstep_rows_do_not_depend_on_the_batch(model, one_thread):
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    both = traced(model, ids, sampling="fast", seed=[11, 12], batching="lockstep", trace_top_k=4).trace
    alone = traced(model, ids[1:], sampling="fast", seed=[12], batching="lockstep", trace_top_k=4).trace
    assert both.manifest["row_seeds"] == [11, 12]
    # row 1's canvases and argmaxes match its run alone, step for step, while it is active
    n = min(alone.tensors["canvas_index"].shape[0], both.tensors["canvas_index"].shape[0])
    same = both.tensors["canvas_index"][:n] == alone.tensors["canvas_index"][:n]
    checked = 0
    for r in range(n):
        if same[r] and alone.tensors["active"][r, 0] and both.tensors["active"][r, 1]:
            assert torch.equal(both.tensors["input_canvas"][r, 1], alone.tensors["input_canvas"][r, 0])
            assert torch.equal(both.tensors["argmax"][r, 1], alone.tensors["argmax"][r, 0])
            checked += 1
    assert checked >= STEPS


def test_a_trace_records_the_batching_the_call_runs_and_refuses_bad_widths(model):
    ids = torch.randint(4, 100, (2, 5))
    # with `batching` unset a trace records what the call runs without it: mixed for per-row samplers
    out = model.generate(ids, sampling="fast", seed=0, return_trace=True, max_new_tokens=16)
    plain = model.generate(ids, sampling="fast", seed=0, max_new_tokens=16, return_dict_in_generate=True)
    assert out.trace.manifest["batching"] == "mixed" and out.trace.is_mixed
    assert torch.equal(out.sequences, plain.sequences)
    with pytest.raises(ValueError, match="cannot run with return_trace: a trace records one batch"):
        model.generate(ids, sampling="fast", seed=0, return_trace=True, batching="lockstep", max_batch_size=1,
                       max_new_tokens=16)
    with pytest.raises(ValueError, match="trace_top_k"):
        model.generate(ids, return_trace=True, trace_top_k=0, max_new_tokens=16)


def test_no_trace_when_off(model, one_thread):
    torch.manual_seed(0)
    out = model.generate(torch.randint(4, 100, (1, 5)), max_new_tokens=16, max_denoising_steps=2)
    assert out.trace is None


def test_malformed_traces_name_the_problem(model, tmp_path, one_thread):
    trace = traced(model, torch.randint(4, 100, (1, 5))).trace
    with pytest.raises(TraceFormatError, match="manifest.json is missing"):
        load_trace(tmp_path)
    bad = Trace(dict(trace.manifest), dict(trace.tensors))
    bad.tensors["argmax"] = bad.tensors["argmax"][:, :, :3]
    with pytest.raises(TraceFormatError, match="`argmax` has L = 3"):
        bad.save(tmp_path / "x")
    bad = Trace(dict(trace.manifest), dict(trace.tensors))
    del bad.tensors["entropy"]
    with pytest.raises(TraceFormatError, match="missing: entropy"):
        bad.save(tmp_path / "x")
    bad = Trace({**trace.manifest, "version": 99}, dict(trace.tensors))
    with pytest.raises(TraceFormatError, match="version"):
        bad.save(tmp_path / "x")
    minimal = Trace(trace.manifest, {"sequences": trace.tensors["sequences"]})
    minimal.save(tmp_path / "m")
    assert load_trace(tmp_path / "m").is_minimal
