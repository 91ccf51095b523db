"""Malformed traces (accuracy/format.py `validate`, accuracy/replay.py) are refused naming what is wrong, `compare`
exits 2 on them, and `trace --out` writes atomically and never replaces a trace without --overwrite (issue 29)."""

import copy
import json

import pytest
import torch

from diffusiongemma.accuracy import load_trace
from diffusiongemma.accuracy.format import TraceFormatError, validate
from diffusiongemma.cli import main


@pytest.fixture(scope="module")
def recorded(saved_pair):
    _, _, model = saved_pair
    torch.manual_seed(1)
    ids = torch.tensor([[0, 0, 10, 20, 30], [5, 6, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    return model.generate(ids, attention_mask=mask, max_new_tokens=32, max_denoising_steps=3, return_trace=True,
                          trace_top_k=4).trace


def tampered(trace, tensors=None, manifest=None):
    t = copy.deepcopy(trace)
    for name, edit in (tensors or {}).items():
        t.tensors[name] = edit(t.tensors[name].clone())
    t.manifest.update(manifest or {})
    return t


def set_at(index, value):
    def edit(x):
        x[index] = value
        return x
    return edit


CASES = {
    "no active row": ({"active": lambda x: x.zero_()}, None, "False everywhere"),
    "shuffled step_index": ({"step_index": lambda x: x.flip(0)}, None, "`step_index` at record 0"),
    "steps_remaining 0": ({"steps_remaining": lambda x: x.zero_()}, None, "`steps_remaining` at record 0 is 0"),
    "steps_remaining not counting down": ({"steps_remaining": set_at(1, 99)}, None, "`steps_remaining` at record 1"),
    "NaN entropy": ({"entropy": set_at((0, 1, 0), float("nan"))}, None, "`entropy` holds NaN"),
    "NaN topk_logprobs": ({"topk_logprobs": set_at((0, 1, 0, 0), float("nan"))}, None, "`topk_logprobs` holds NaN"),
    "positive logprobs": ({"topk_logprobs": set_at((0, 1, 0, 0), 3.0)}, None, "positive log-probabilities"),
    "NaN sc_logprobs": ({"sc_logprobs": set_at((1, 1, 0, 0), float("nan"))}, None, "`sc_logprobs` holds NaN"),
    "negative token id": ({"topk_ids": set_at((0, 0, 0, 0), -3)}, None, "`topk_ids` holds negative"),
    "negative sequence id": ({"sequences": set_at((0, 3), -1)}, None, "`sequences` holds negative"),
    "id beyond vocab": ({"argmax": set_at((0, 0, 0), 500)}, {"vocab_size": 128}, "outside [0, vocab_size=128)"),
    "all-False mask row": ({"attention_mask": set_at(0, False)}, None, "rows [0] are all False"),
    "right-padded mask": ({"attention_mask": lambda x: x.flip(1)}, None, "not left-padded"),
    "negative entropy_bound": (None, {"generation_config": {"sampler_config": {"entropy_bound": -0.5}}},
                               "entropy_bound` must be a finite number > 0"),
    "mistyped stability_threshold": (None, {"generation_config": {"stability_threshold": "1"}},
                                     "stability_threshold` must be an int >= 0"),
    "mistyped generation_config": (None, {"generation_config": [1]}, "must be a JSON object"),
    "mistyped vocab_size": (None, {"vocab_size": "128"}, "`vocab_size` must be a positive int"),
    "mistyped prompt_length": (None, {"prompt_length": True}, "`prompt_length` must be a non-negative int"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_trace_is_named(recorded, case):
    tensors, manifest, message = CASES[case]
    validate(recorded)  # the untouched trace is fine
    with pytest.raises(TraceFormatError) as error:
        validate(tampered(recorded, tensors, manifest))
    assert message in str(error.value)


def test_the_replay_checks_ids_against_the_model_without_vocab_size(saved_pair, recorded, tmp_path, capsys):
    path = saved_pair[0]
    bad = tampered(recorded, {"input_canvas": set_at((0, 0, 0), 128)})
    del bad.manifest["vocab_size"]
    bad.save(tmp_path / "t")
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "`input_canvas` holds token id 128, outside the model's vocabulary" in err and "Traceback" not in err


def test_compare_exits_2_on_a_malformed_trace_and_refuses_nan_thresholds(saved_pair, recorded, tmp_path, capsys):
    path = saved_pair[0]
    good = tmp_path / "good"
    recorded.save(good)
    bad = tmp_path / "bad"
    recorded.save(bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["generation_config"]["sampler_config"]["entropy_bound"] = -1.0
    (bad / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(bad)]) == 2
    assert "entropy_bound" in capsys.readouterr().err
    for flag, value in (("--min-top1", "nan"), ("--min-top1", "1.5"), ("--max-kl", "-1"), ("--max-kl", "inf")):
        with pytest.raises(SystemExit) as exit_:
            main(["compare", "--model", str(path), "--trace", str(good), flag, value])
        assert exit_.value.code == 2 and flag in capsys.readouterr().err


def test_save_is_atomic_and_a_mixed_folder_is_refused(recorded, tmp_path, monkeypatch):
    folder = tmp_path / "t"
    recorded.save(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(FileExistsError, match="overwrite"):
        recorded.save(folder)
    other = tampered(recorded, {"entropy": lambda x: x + 0.5})
    import safetensors.torch

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        other.save(folder, overwrite=True)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the old trace, whole
    assert not list(tmp_path.glob(".t.tmp-*"))
    other.save(tmp_path / "other")
    (folder / "manifest.json").write_bytes((tmp_path / "other" / "manifest.json").read_bytes())  # a new manifest
    with pytest.raises(TraceFormatError, match="tensors_sha256"):  # beside the old tensors
        load_trace(folder)


def test_trace_out_needs_overwrite(saved_pair, tmp_path, capsys, one_thread):
    path = saved_pair[0]
    args = ["trace", "--model", str(path), "--prompt", "Hi", "--out", str(tmp_path / "t"), "--max-new-tokens", "16",
            "--steps", "2"]
    assert main(args) == 0
    first = (tmp_path / "t" / "manifest.json").read_text()
    capsys.readouterr()
    assert main(args) == 2 and "pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "t" / "manifest.json").read_text() == first
    assert main(args + ["--overwrite", "--seed", "3"]) == 0
    assert load_trace(tmp_path / "t").manifest["seed_argument"] == 3


@pytest.mark.parametrize("manifest, message", [
    ({"generation_config": {"sampler_config": {"_cls_name": "Nope"}}}, "cannot be rebuilt"),
    ({"generation_config": {"sampler_config": {"entropy_bound": 0.1, "bogus": 1}}}, "cannot be rebuilt"),
])
def test_unusable_replay_settings_are_a_malformed_trace(saved_pair, recorded, tmp_path, capsys, manifest, message):
    tampered(recorded, manifest=manifest).save(tmp_path / "t")
    capsys.readouterr()
    assert main(["compare", "--model", str(saved_pair[0]), "--trace", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
