"""`diffusiongemma train sft` (training/cli.py, sft.py, data.py) on a tiny model folder, CPU."""

import json
import os
import re

import datasets
import pytest
import torch

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.cli import main
from conftest import tiny_model, tiny_tokenizer


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "base"
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def write_rows(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


ROWS = [{"prompt": f"copy {w}:", "completion": w * 3} for w in ("abcdefg", "hijklmn", "opqrstu", "vwxyzab")] + [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "model", "content": "hello there, how are you"}]}]


def sft(folder, data, out, *extra):
    return main(["train", "sft", "--model", str(folder), "--data", str(data), "--out", str(out), "--batch-size", "4",
                 "--quiet", "--threads", "1", *extra])


def test_full_fine_tuning_writes_a_model_and_resumes(folder, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "out"
    assert sft(folder, data, out, "--epochs", "2", "--save-steps", "2", "--lr", "1e-3") == 0
    assert "done: 4 steps" in capsys.readouterr().out
    tuned = DiffusionGemmaForBlockDiffusion.from_pretrained(out)
    base = DiffusionGemmaForBlockDiffusion.from_pretrained(folder)
    assert not torch.equal(tuned.lm_head.weight, base.lm_head.weight)
    assert os.path.isfile(out / "tokenizer.json") and os.path.isdir(out / "checkpoints" / "checkpoint-4")
    # resuming from the newest checkpoint with more epochs continues at step 4
    assert sft(folder, data, out, "--epochs", "3", "--save-steps", "2", "--lr", "1e-3", "--resume") == 0
    assert "done: 6 steps" in capsys.readouterr().out


def test_lora_writes_the_adapter_and_a_merged_model(folder, tmp_path):
    from peft import PeftModel

    data = datasets.Dataset.from_list(ROWS[:4])
    data.save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "lora"
    assert sft(folder, tmp_path / "ds", out, "--lora", "--lora-rank", "4", "--epochs", "1") == 0
    merged = DiffusionGemmaForBlockDiffusion.from_pretrained(out).eval()
    adapted = PeftModel.from_pretrained(DiffusionGemmaForBlockDiffusion.from_pretrained(folder), out / "adapter").eval()
    ids, canvas = torch.tensor([[5, 6, 7]]), torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids, decoder_input_ids=canvas).logits,
                                   adapted(input_ids=ids, decoder_input_ids=canvas).logits, rtol=1e-4, atol=1e-4)  # W + BA rounding


@pytest.mark.parametrize("bad, message", [
    ('{"prompt": "a", "completion": 3}', "line 3 of .*d.jsonl: 'completion' must be a string"),
    ('{"prompt": "a", "completion": "b"', "line 3 of .*d.jsonl: not valid JSON"),
    ('{"text": "a"}', r"line 3 of .*d.jsonl: needs 'prompt' and 'completion'"),
])
def test_a_bad_row_names_its_line(folder, tmp_path, capsys, bad, message):
    data = write_rows(tmp_path / "d.jsonl", [ROWS[0], "", bad])  # line 2 is blank, skipped
    assert sft(folder, data, tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()  # refused before training


def test_too_long_rows_are_refused_not_truncated(folder, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", ROWS)
    assert sft(folder, data, tmp_path / "out", "--max-length", "20") == 1
    err = capsys.readouterr().err
    assert "line 1 of" in err and "exceed max_length 20" in err, err


def test_resume_without_a_checkpoint_is_an_error(folder, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", ROWS)
    assert sft(folder, data, tmp_path / "out", "--resume") == 1
    assert "--resume: no checkpoint" in capsys.readouterr().err
