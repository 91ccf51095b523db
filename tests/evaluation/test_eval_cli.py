"""`diffusiongemma eval` (evaluation/cli.py): lm-eval's table on stdout, its JSON with our figures, progress on
stderr, and bad flags refused with the flag named."""

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from diffusiongemma.cli import main  # noqa: E402
from diffusiongemma.sudoku.demo import DEMO_MODEL  # noqa: E402

TASKS = str(Path(__file__).parent / "tasks")


def test_eval_prints_the_table_and_writes_the_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "results.json"
    code = main(["eval", "--model", str(DEMO_MODEL), "--tasks", "sudoku_solve", "--include-path", TASKS,
                 "--limit", "2", "--batch-size", "2", "--dtype", "float32", "--device", "cpu", "--output", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "|sudoku_solve|" in captured.out.replace(" ", "") and "solved" in captured.out
    assert "mean denoising passes per answer" in captured.out
    assert "generating" in captured.err  # the progress bar
    results = json.loads(out.read_text())
    assert results["results"]["sudoku_solve"]["sample_len"] == 2
    assert results["diffusiongemma"]["generated_answers"] == 2 and results["diffusiongemma"]["mean_denoising_passes"]


@pytest.mark.parametrize("flags, message", [
    (["--tasks", "sudoku_solve", "--include-path", "/nonexistent"], "--include-path"),
    (["--tasks", "sudoku_solve", "--include-path", TASKS, "--output", "/tmp"], "--output"),
])
def test_bad_flags_are_named(flags, message, capsys):
    assert main(["eval", "--model", str(DEMO_MODEL), *flags]) == 1
    assert message in capsys.readouterr().err


def test_limit_must_be_a_count_or_a_fraction(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--model", str(DEMO_MODEL), "--tasks", "x", "--limit", "1.5"])
    assert "--limit" in capsys.readouterr().err
