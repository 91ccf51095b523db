"""Golden outputs (accuracy/golden.py) and `diffusiongemma golden`."""

import json

from diffusiongemma.cli import main


def test_golden_check_passes_on_a_rerun_and_fails_with_another_seed(saved_pair, tmp_path, capsys, one_thread):
    path = saved_pair[0]
    (tmp_path / "prompts.txt").write_text("Hello there\nSecond prompt\n")
    golden = tmp_path / "golden.jsonl"
    assert main(["golden", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(golden),
                 "--seed", "7", "--max-new-tokens", "32", "--steps", "3"]) == 0
    records = [json.loads(line) for line in golden.read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["Hello there", "Second prompt"]
    first = records[0]
    assert len(first["tokens"]) == 32 and first["seed"] == 7 and first["max_denoising_steps"] == 3
    assert len(first["steps_per_canvas"]) == 2 and all(1 <= s <= 3 for s in first["steps_per_canvas"])
    assert len(first["fingerprint"]["ids"]) == 16 and len(first["fingerprint"]["ids"][0]) == 4
    assert abs(first["tokens_per_forward"] - 32 / sum(first["steps_per_canvas"])) < 1e-5
    capsys.readouterr()
    assert main(["golden", "--check", str(golden), "--model", str(path)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["golden", "--check", str(golden), "--model", str(path), "--seed", "8"]) == 1
    out = capsys.readouterr().out
    assert "record 0: first divergence at token" in out and "canvas 0" in out and "expected text" in out
    assert "FAIL (2 record(s) differ)" in out


def test_golden_names_a_tampered_fingerprint_and_a_bad_file(saved_pair, tmp_path, capsys, one_thread):
    path = saved_pair[0]
    (tmp_path / "prompts.txt").write_text("Hi\n")
    golden = tmp_path / "golden.jsonl"
    assert main(["golden", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(golden),
                 "--max-new-tokens", "16", "--steps", "2"]) == 0
    record = json.loads(golden.read_text())
    record["fingerprint"]["logprobs"][5][0] += 0.01
    golden.write_text(json.dumps(record) + "\n")
    capsys.readouterr()
    assert main(["golden", "--check", str(golden), "--model", str(path)]) == 1
    assert "fingerprint log-probs at position 5" in capsys.readouterr().out
    golden.write_text('{"prompt": "x"}\n')
    assert main(["golden", "--check", str(golden), "--model", str(path)]) == 2
    assert "golden.jsonl:1 lacks" in capsys.readouterr().err
