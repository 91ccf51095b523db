"""The offline Sudoku lm-eval tasks (tests/evaluation/tasks) on the bundled model: the generation task's solve rate
equals `diffusiongemma sudoku --eval` on the same puzzles, and the ELBO prefers the correct grid."""

import json
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.tasks import TaskManager  # noqa: E402

from diffusiongemma.cli import main  # noqa: E402
from diffusiongemma.evaluation import DiffusionGemmaLM  # noqa: E402
from diffusiongemma.sudoku.demo import DEMO_MODEL  # noqa: E402

TASKS = str(Path(__file__).parent / "tasks")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def lm():
    return DiffusionGemmaLM(pretrained=str(DEMO_MODEL), dtype="float32", device="cpu", batch_size=50, seed=0,
                            mc_samples=4)


def evaluate(lm, task: str, limit: int) -> dict:
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_path=TASKS, include_defaults=False), limit=limit,
                                  log_samples=True)
    return out


def test_solve_rate_equals_the_sudoku_command(lm, capsys):
    lm.generation_passes.clear()
    out = evaluate(lm, "sudoku_solve", 6)
    rate = out["results"]["sudoku_solve"]["solved,none"]
    assert main(["sudoku", "--eval", "6", "--givens", "36", "--seed", "0", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rate == expected["solve_rate"] and 0 < rate
    # the same passes too: mean_steps counts the same denoising passes per answer
    assert sum(lm.generation_passes) / len(lm.generation_passes) == pytest.approx(expected["mean_steps"])


def test_elbo_prefers_the_correct_grid(lm):
    out = evaluate(lm, "sudoku_choice", 3)
    assert out["results"]["sudoku_choice"]["acc,none"] == 1.0
    for sample in out["samples"]["sudoku_choice"]:
        scores = [r[0][0] for r in sample["resps"]]
        gold = sample["doc"]["gold"]
        assert max(range(len(scores)), key=scores.__getitem__) == gold


def test_simple_evaluate_by_name_with_model_args():
    """The registered name and a model_args string, as `lm_eval --model diffusiongemma --model_args ...` passes them."""
    out = lm_eval.simple_evaluate(
        model="diffusiongemma", limit=2, tasks=["sudoku_solve"],
        model_args=f"pretrained={DEMO_MODEL},dtype=float32,device=cpu,batch_size=2,max_denoising_steps=8,seed=0,"
                   "sampler_preset=block-refinement",
        task_manager=TaskManager(include_path=TASKS, include_defaults=False))
    assert out["results"]["sudoku_solve"]["sample_len"] == 2
    assert out["config"]["model"] == "diffusiongemma"
