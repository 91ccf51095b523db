"""`train sft` checkpoints and guards (training/checkpoints.py, sft.py, cli.py): atomic saves, resuming from the
newest complete checkpoint, refused non-finite or negative settings, a run that stops on a non-finite loss."""

import json
import os
import re

import pytest
from transformers import Trainer

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.cli import main
from diffusiongemma.training.checkpoints import NonFiniteLossError
from diffusiongemma.training.sft import SFTConfig, run_sft
from conftest import tiny_model, tiny_tokenizer

ROWS = [{"prompt": f"copy {w}:", "completion": w * 2} for w in ("abcdefg", "hijklmn", "opqrstu", "vwxyzab")]


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "base"
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def sft(folder, data, out, *extra):
    return main(["train", "sft", "--model", str(folder), "--data", str(data), "--out", str(out), "--batch-size", "2",
                 "--quiet", "--threads", "1", "--save-steps", "1", *extra])


def listing(path):
    return sorted(os.listdir(path))


def test_ctrl_c_during_a_save_keeps_the_previous_checkpoint_and_resume_works(folder, data, tmp_path, monkeypatch,
                                                                              capsys):
    calls = []
    original = Trainer._save_rng_state

    def interrupted_at_the_second_save(self, output_dir):
        calls.append(output_dir)
        if len(calls) == 2:  # half of checkpoint-2 is written (weights, optimizer), then Ctrl-C
            raise KeyboardInterrupt
        return original(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", interrupted_at_the_second_save)
    out = tmp_path / "out"
    assert sft(folder, data, out) == 130
    checkpoints = out / "checkpoints"
    assert listing(checkpoints) == ["checkpoint-1"]  # no half-written checkpoint-2, no staging folder left
    assert {"trainer_state.json", "optimizer.pt", "model.safetensors"} <= set(listing(checkpoints / "checkpoint-1"))
    monkeypatch.setattr(Trainer, "_save_rng_state", original)
    capsys.readouterr()
    assert sft(folder, data, out, "--resume") == 0
    captured = capsys.readouterr()
    assert "resuming from" in captured.err and "checkpoint-1" in captured.err
    assert "done: 2 steps" in captured.out
    assert listing(checkpoints) == ["checkpoint-1", "checkpoint-2"]  # save_total_limit 2, rotated after the swap


def test_resume_skips_an_incomplete_newer_checkpoint_naming_it(folder, data, tmp_path, capsys):
    out = tmp_path / "out"
    assert sft(folder, data, out) == 0
    torn = out / "checkpoints" / "checkpoint-7"  # e.g. left by an older version killed mid-save
    torn.mkdir()
    (torn / "config.json").write_text("{}")
    capsys.readouterr()
    assert sft(folder, data, out, "--resume", "--epochs", "2") == 0
    err = capsys.readouterr().err
    assert re.search(r"skipping .*checkpoint-7, which is incomplete \(no readable trainer_state.json\)", err), err
    assert re.search(r"resuming from .*checkpoint-2\b", err), err


def test_resume_with_only_incomplete_checkpoints_is_an_error(folder, data, tmp_path, capsys):
    (tmp_path / "out" / "checkpoints" / "checkpoint-3").mkdir(parents=True)
    assert sft(folder, data, tmp_path / "out", "--resume") == 1
    err = capsys.readouterr().err
    assert "incomplete" in err and re.search(r"--resume: no checkpoint in .* that is complete", err)


@pytest.mark.parametrize("flag, value", [("--lr", "inf"), ("--lr", "nan"), ("--ar-weight", "nan"),
                                         ("--ar-weight", "-50"), ("--ar-weight", "inf"), ("--epochs", "inf")])
def test_non_finite_or_negative_settings_are_refused_naming_the_flag(folder, data, tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        sft(folder, data, tmp_path / "out", flag, value)
    assert exit_info.value.code == 2
    assert re.search(rf"argument {flag}: .*must be a finite number", capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value, name", [("lr", float("inf"), "--lr"), ("ar_weight", float("nan"), "--ar-weight"),
                                                ("ar_weight", -50.0, "--ar-weight"), ("epochs", 0.0, "--epochs")])
def test_the_api_refuses_them_too(folder, data, tmp_path, field, value, name):
    cfg = SFTConfig(model=str(folder), data=str(data), out=str(tmp_path / "out"), **{field: value})
    with pytest.raises(ValueError, match=rf"{name} \({field}\) must be a finite number"):
        run_sft(cfg, log=lambda _: None)


def test_a_loss_that_becomes_non_finite_stops_the_run_without_a_final_save(folder, data, tmp_path, capsys):
    """A finite but absurd learning rate blows the weights up; the run stops with an error naming the step and
    writes no final model (the good one already in OUT stays)."""
    out = tmp_path / "out"
    tiny_model(seed=5).save_pretrained(out)  # a good model from an earlier run
    before = (out / "model.safetensors").read_bytes()
    assert sft(folder, data, out, "--lr", "1e30", "--epochs", "3") == 1
    err = capsys.readouterr().err
    assert re.search(r"the training loss is (nan|inf) at step \d+|trainable weights hold NaN or Inf", err), err
    assert (out / "model.safetensors").read_bytes() == before
    DiffusionGemmaForBlockDiffusion.from_pretrained(out)  # still loads
    for name in listing(out / "checkpoints"):  # no checkpoint holds NaN weights
        assert (out / "checkpoints" / name / "trainer_state.json").is_file()


def test_the_loss_guard_itself(folder, tmp_path):
    import torch

    from diffusiongemma.training.checkpoints import SFTTrainer

    class NaNLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x, labels=None):
            return {"loss": self.w * float("nan")}

    from transformers import TrainingArguments

    trainer = SFTTrainer(model=NaNLoss(), args=TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                                                  max_steps=2, disable_tqdm=True),
                         train_dataset=[{"x": torch.ones(1)}] * 4)
    with pytest.raises(NonFiniteLossError, match="the training loss is nan at step 1"):
        trainer.train()


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -50.0])
def test_a_bad_ar_loss_weight_in_the_config_is_refused_by_the_loss(weight):
    """The Trainer path without `train sft`: `config.ar_loss_weight` is checked where the loss uses it."""
    import torch

    model = tiny_model().train()
    model.config.ar_loss_weight = weight
    with pytest.raises(ValueError, match=r"config.ar_loss_weight.* must be a finite number >= 0"):
        model(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.randint(4, 100, (1, 16)))
