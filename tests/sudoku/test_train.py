"""Tests of the Sudoku training recipe (sudoku/train.py, sudoku/checkpoint.py) and `diffusiongemma train sudoku`."""

import json
import logging
import math
import signal

import pytest
import torch

from diffusiongemma.cli import main
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.sudoku import data
from diffusiongemma.modeling.rope import rope_inv_freq
from diffusiongemma.sudoku.train import SudokuTrainConfig, sudoku_model_config, train_sudoku, warmup_cosine

TINY = ["--batch-size", "4", "--pool-size", "6", "--hidden-size", "32", "--layers", "2", "--givens", "60",
        "--eval-puzzles", "2", "--warmup", "2", "--threads", "1"]


def weights(folder) -> dict:
    return DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=torch.float32).state_dict()


def last_log_entry(out) -> dict:
    return json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])


def test_warmup_cosine():
    assert warmup_cosine(0, 10, 100) == 0.1 and warmup_cosine(9, 10, 100) == 1.0
    assert abs(warmup_cosine(100, 10, 100) - 0.1) < 1e-9


def test_base3_positions_put_the_grid_periods_on_single_frequencies():
    rope = sudoku_model_config(hidden_size=64, positions="base3").text_config.rope_parameters
    sliding = rope_inv_freq(rope["sliding_attention"], 16)  # [8]: 4 rotated (half), 4 content-only
    full = rope_inv_freq(rope["full_attention"], 16)  # [8]: 2 rotated (a quarter)
    assert torch.allclose(2 * math.pi / sliding[:4], torch.tensor([3.0, 9.0, 27.0, 81.0]), rtol=1e-5)
    assert torch.allclose(2 * math.pi / full[:2], torch.tensor([3.0, 9.0]), rtol=1e-5)
    assert not sliding[4:].any() and not full[2:].any()
    default = sudoku_model_config(positions="default").text_config.rope_parameters
    assert default["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}
    with pytest.raises(ValueError, match="positions must be one of"):
        sudoku_model_config(positions="2d")


def test_base3_config_builds_without_the_factor_warning_and_other_warnings_still_show():
    logger = logging.getLogger("transformers.modeling_rope_utils")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        sudoku_model_config(hidden_size=32, num_layers=2, positions="base3")
        assert records == []
        rope = {"rope_type": "proportional", "rope_theta": 100.0, "bogus": 1.0}
        sudoku_model_config(hidden_size=32, num_layers=2).text_config.__class__(rope_parameters=rope)
        assert any("bogus" in r.getMessage() for r in records)
    finally:
        logger.removeHandler(handler)


def test_base3_model_generates_like_the_builtin(tmp_path):
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import (
        DiffusionGemmaForBlockDiffusion as Builtin,
    )

    torch.manual_seed(0)
    ours = DiffusionGemmaForBlockDiffusion(sudoku_model_config(hidden_size=32, num_layers=2, positions="base3"))
    ours.eval().save_pretrained(tmp_path)
    builtin = Builtin.from_pretrained(tmp_path).eval()
    ids = torch.randint(4, 15, (2, 83))
    runs = []
    for model in (ours, builtin):
        torch.manual_seed(1)
        runs.append(model.generate(ids, max_new_tokens=82, max_denoising_steps=4, return_dict_in_generate=True))
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_curriculum_moves_from_start_to_target():
    cfg = SudokuTrainConfig(out="x", givens=36, givens_min=30, givens_start=50, curriculum_steps=100, givens_spread=6)
    assert cfg.training_givens(0) == (50, 56)
    assert cfg.training_givens(50) == (40, 46)
    assert cfg.training_givens(100) == cfg.training_givens(5000) == (30, 36)
    assert SudokuTrainConfig(out="x", givens=36).training_givens(0) == (36, 44)  # no curriculum: givens..+spread


def test_train_runs_writes_everything_and_learns(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "sudoku", "--out", str(out), "--steps", "6", "--eval-every", "3", "--lr", "3e-3",
                 "--eval-givens", "70", *TINY]) == 0
    printed = capsys.readouterr()
    assert printed.out.count("solved ") + printed.err.count("solved ") == 2  # one line per evaluation, no repeat
    assert printed.out.strip().splitlines()[-1].startswith(f"done at step 6: model written to {out}")
    summary = last_log_entry(out)
    assert summary["step"] == 6 and set(summary["eval_60"]) >= {"solve_rate", "mean_steps", "count"}
    assert summary["eval_60"]["count"] == 2 and summary["eval_70"]["count"] == 2
    for name in ("model.safetensors", "tokenizer.json", "generation_config.json", "checkpoint/trainer_state.pt",
                 "checkpoint/model.safetensors", "pool-G60-N6-S0.txt"):
        assert (out / name).exists(), name
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == [3, 6]
    assert log[-1]["puzzles_seen"] == 24 and log[-1]["puzzles_per_s"] > 0
    assert log[-1]["diffusion_loss"] < log[0]["diffusion_loss"]  # 3e-3 on a tiny model: the loss drops at once
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=True)  # no pickled objects
    assert state["step"] == 6 and state["config"]["batch_size"] == 4


def test_resume_continues_bit_for_bit(tmp_path, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--steps", "4", "--eval-every", "2", "--givens-start", "70", "--curriculum-steps", "4", *TINY]
    assert main(["train", "sudoku", "--out", str(straight), *common]) == 0
    interrupted = ["--steps", "4", "--eval-every", "100", "--givens-start", "70", "--curriculum-steps", "4", *TINY]
    calls = {"n": 0}
    real_draw = data.draw_pairs

    def draw_then_interrupt(*args):  # Ctrl-C during the second step: that step finishes, then the run stops
        calls["n"] += 1
        if calls["n"] == 2:
            signal.raise_signal(signal.SIGINT)
        return real_draw(*args)

    data.draw_pairs = draw_then_interrupt
    try:
        assert main(["train", "sudoku", "--out", str(split), *interrupted]) == 130
    finally:
        data.draw_pairs = real_draw
    assert "interrupted: checkpoint saved at step 2" in capsys.readouterr().out
    assert torch.load(split / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 2
    assert main(["train", "sudoku", "--out", str(split), "--resume"]) == 0  # saved settings, steps 3..4
    a, b = weights(straight / "checkpoint"), weights(split / "checkpoint")
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(straight / "checkpoint" / "trainer_state.pt", weights_only=True)
    sb = torch.load(split / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert sa["step"] == sb["step"] == 4 and sa["python_rng"] == sb["python_rng"]
    assert torch.equal(sa["loss_rng"], sb["loss_rng"])
    assert torch.equal(sa["optimizer"]["state"][0]["exp_avg_sq"], sb["optimizer"]["state"][0]["exp_avg_sq"])


def test_init_from_starts_from_given_weights(tmp_path):
    first = tmp_path / "first"
    train_sudoku(SudokuTrainConfig(out=str(first), steps=1, batch_size=2, pool_size=2, hidden_size=32, num_layers=2,
                                   givens=70, eval_every=1, eval_puzzles=1), log=lambda *a: None)
    second = SudokuTrainConfig(out=str(tmp_path / "second"), steps=1, batch_size=2, pool_size=2, givens=70,
                               eval_every=1, eval_puzzles=1, init_from=str(first), lr=0.0, warmup=1)
    train_sudoku(second, log=lambda *a: None)
    a, b = weights(first), weights(tmp_path / "second")  # lr 0: the step leaves the weights as loaded
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_without_checkpoint_names_the_fix(tmp_path, capsys):
    # the command line turns the FileNotFoundError into one error line and exit status 1
    assert main(["train", "sudoku", "--out", str(tmp_path / "none"), "--resume"]) == 1
    assert "train without --resume first" in capsys.readouterr().err


def test_resume_from_another_device_reseeds_the_loss_generator(tmp_path):
    cfg = SudokuTrainConfig(out=str(tmp_path), steps=1, batch_size=2, pool_size=2, hidden_size=32, num_layers=2,
                            givens=70, eval_every=1, eval_puzzles=1)
    train_sudoku(cfg, log=lambda *a: None)
    path = tmp_path / "checkpoint" / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    assert state["loss_rng_device"] == "cpu"
    state["loss_rng_device"] = "cuda"  # as if the first part ran on a GPU
    torch.save(state, path)
    logs = []
    summary = train_sudoku(SudokuTrainConfig(**{**cfg.__dict__, "steps": 2}), resume=True, log=logs.append)
    assert summary["step"] == 2 and any("not bit-identical" in line for line in logs)


@pytest.mark.parametrize("option, value", [("--hidden-size", "64"), ("--layers", "3"), ("--seed", "5"),
                                           ("--positions", "default")])
def test_resume_refuses_options_that_conflict_with_the_checkpoint(tmp_path, capsys, option, value):
    tiny = ["--steps", "1", "--batch-size", "2", "--pool-size", "2", "--hidden-size", "32", "--layers", "2",
            "--givens", "70", "--eval-every", "1", "--eval-puzzles", "1"]
    assert main(["train", "sudoku", "--out", str(tmp_path), *tiny]) == 0
    capsys.readouterr()
    assert main(["train", "sudoku", "--out", str(tmp_path), "--resume", "--steps", "2", option, value]) == 1
    err = capsys.readouterr().err
    assert f"{option} {value} conflicts with --resume" in err and "drop" in err
