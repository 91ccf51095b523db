"""`diffusiongemma kl` (accuracy/kl.py): KL of a checkpoint from its base on the base's trajectories (issue 37)."""

import json

import pytest
import torch

from diffusiongemma.accuracy.kl import summarize_kl
from diffusiongemma.cli import main
from diffusiongemma.model import DiffusionGemmaForBlockDiffusion


@pytest.fixture(scope="module")
def perturbed_copy(saved_pair, tmp_path_factory):
    path = saved_pair[0]
    folder = tmp_path_factory.mktemp("perturbed")
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith("o_proj.weight"):
                w.add_(0.2 * w.std() * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(folder)
    return folder


@pytest.fixture
def prompts(tmp_path):
    (tmp_path / "p.txt").write_text("Hello there\nAnother prompt\n")
    return tmp_path / "p.txt"


def run_kl(capsys, base, model, prompts, *extra):
    capsys.readouterr()
    code = main(["kl", "--base", str(base), "--model", str(model), "--prompts", str(prompts), "--max-tokens", "16",
                 "--steps", "2", "--json", *extra])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out.strip() else None), captured.err


def test_a_model_against_itself_has_zero_kl(saved_pair, prompts, capsys, one_thread):
    path = saved_pair[0]
    code, report, _ = run_kl(capsys, path, path, prompts, "--max-kl-mean", "0")
    assert code == 0 and report["kl_mean"] == pytest.approx(0, abs=1e-9)
    assert set(report["kl_quantiles"]) == {"50", "90", "95", "99", "max"} and len(report["kl_ci95"]) == 2
    # the random tiny model is flat: most positions are near ties, counted apart; none flips against itself
    assert report["top1_agreement"] in (None, 1.0) and report["near_tie_flips"] == 0
    assert report["dp_rms"] == pytest.approx(0, abs=1e-9)
    assert report["positions"] == 2 * 16 * 2  # 2 rows, 16 positions, 2 steps (the tiny model never stops early)


def test_a_perturbed_model_has_kl_and_fails_a_threshold(saved_pair, perturbed_copy, prompts, capsys, one_thread):
    path = saved_pair[0]
    code, report, _ = run_kl(capsys, path, perturbed_copy, prompts, "--samples", "2")
    assert code == 0 and report["kl_mean"] > 1e-4 and report["sequences"] == 4
    lo, hi = report["kl_ci95"]
    assert lo <= report["kl_mean"] <= hi and report["kl_quantiles"]["max"] >= report["kl_quantiles"]["99"]
    code, report, _ = run_kl(capsys, path, perturbed_copy, prompts, "--max-kl-mean", "1e-6")
    assert code == 1 and report["failed_thresholds"] == ["max_kl_mean"]


def test_bad_input_exits_2_naming_it(saved_pair, tmp_path, prompts, capsys):
    path = saved_pair[0]
    code, _, err = run_kl(capsys, path, tmp_path / "nowhere", prompts)
    assert code == 2 and "--model" in err
    (tmp_path / "empty.txt").write_text("\n")
    code, _, err = run_kl(capsys, path, path, tmp_path / "empty.txt")
    assert code == 2 and "holds no prompts" in err


def test_near_ties_are_counted_apart():
    part = {"kl": torch.tensor([0.0, 0.1]), "same_top1": torch.tensor([True, False]), "dp": torch.tensor([0.0, 0.2]),
            "near_tie": torch.tensor([False, True]), "row": torch.tensor([0, 0])}
    report = summarize_kl([part])
    assert report["top1_agreement"] == 1.0 and report["near_ties"] == 1 and report["near_tie_flips"] == 1
    assert report["dp_rms"] == pytest.approx(0.2 / 2 ** 0.5)


@pytest.mark.parametrize("scheme", ["bnb-8bit", "bnb-4bit"])
def test_bitsandbytes_quantization_of_the_model_side(tmp_path, prompts, capsys, one_thread, scheme):
    """`--quantization` loads --model through bitsandbytes (issue 37: kl works on bitsandbytes too); widths the
    CPU 4-bit kernel takes (tests/quantization/test_bnb.py)."""
    bnb = pytest.importorskip("bitsandbytes")
    from conftest import tiny_config, tiny_model, tiny_tokenizer

    tiny_model(tiny_config(intermediate_size=128, head_dim=32, global_head_dim=64), seed=4).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    try:
        code, report, err = run_kl(capsys, tmp_path, tmp_path, prompts, "--quantization", scheme)
    except (RuntimeError, NotImplementedError) as error:  # a bitsandbytes build without CPU kernels
        pytest.skip(f"bitsandbytes {bnb.__version__} cannot run {scheme} on this CPU: {error}")
    assert code == 0, err
    # the same folder on both sides: only the quantization of the model side moves the distribution
    assert 0 < report["kl_mean"] < 0.5 and report["dp_rms"] > 0


def test_quantization_names_are_checked(saved_pair, prompts, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["kl", "--base", str(saved_pair[0]), "--model", str(saved_pair[0]), "--prompts", str(prompts),
              "--quantization", "bnb-2bit"])
    assert exit_.value.code == 2 and "--quantization" in capsys.readouterr().err
