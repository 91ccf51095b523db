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
    assert "golden.jsonl:1 is not a golden record: lacks" in capsys.readouterr().err


def test_golden_check_refuses_what_it_cannot_check(saved_pair, tmp_path, capsys, one_thread):
    """Empty or blank files, truncated fingerprints, NaN log-probs and a wrong tokens_per_forward never pass."""
    path = saved_pair[0]
    (tmp_path / "prompts.txt").write_text("Hi\n")
    golden = tmp_path / "golden.jsonl"
    assert main(["golden", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(golden),
                 "--max-new-tokens", "16", "--steps", "2"]) == 0
    good = json.loads(golden.read_text())

    def check(text):
        golden.write_text(text)
        capsys.readouterr()
        code = main(["golden", "--check", str(golden), "--model", str(path)])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    for text in ("", "\n  \n"):
        code, out = check(text)
        assert code == 2 and "holds no golden records" in out
    code, out = check("\x00\xff binary")
    assert code == 2 and "golden.jsonl" in out
    truncated = json.loads(json.dumps(good))
    truncated["fingerprint"]["ids"] = truncated["fingerprint"]["ids"][:5]
    truncated["fingerprint"]["logprobs"] = truncated["fingerprint"]["logprobs"][:5]
    code, out = check(json.dumps(truncated) + "\n")
    assert code == 1 and "fingerprint: expected 5 positions, got 16" in out
    short_row = json.loads(json.dumps(good))
    short_row["fingerprint"]["ids"][3] = short_row["fingerprint"]["ids"][3][:2]
    code, out = check(json.dumps(short_row) + "\n")
    assert code == 2 and "position 3 must hold 4 ids" in out
    code, out = check(json.dumps(good).replace(str(good["fingerprint"]["logprobs"][2][0]), "NaN", 1) + "\n")
    assert code == 2 and "log-probs are finite" in out
    wrong = dict(good, tokens_per_forward=good["tokens_per_forward"] + 0.5)
    code, out = check(json.dumps(wrong) + "\n")
    assert code == 1 and "tokens per forward" in out
    code, out = check(json.dumps(good) + "\n")
    assert code == 0


def test_golden_out_is_not_replaced_without_overwrite(saved_pair, tmp_path, capsys, one_thread):
    path = saved_pair[0]
    (tmp_path / "prompts.txt").write_text("Hi\n")
    golden = tmp_path / "golden.jsonl"
    golden.write_text("precious\n")
    args = ["golden", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(golden),
            "--max-new-tokens", "16", "--steps", "2"]
    assert main(args) == 2
    assert "pass --overwrite" in capsys.readouterr().err and golden.read_text() == "precious\n"
    assert main(args + ["--overwrite"]) == 0 and json.loads(golden.read_text())["prompt"] == "Hi"
    assert not list(tmp_path.glob(".golden.jsonl.tmp-*"))


def test_golden_check_judges_the_temperature_schedule_and_the_reruns_stop(saved_pair, tmp_path, capsys, one_thread,
                                                                           monkeypatch):
    from diffusiongemma.accuracy import golden as golden_module

    path = saved_pair[0]
    (tmp_path / "prompts.txt").write_text("Hi\n")
    golden = tmp_path / "golden.jsonl"
    assert main(["golden", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(golden),
                 "--max-new-tokens", "16", "--steps", "3"]) == 0
    record = json.loads(golden.read_text())
    assert record["temperatures"] == [sorted(record["temperatures"][0], reverse=True)]  # n counts down
    assert len(record["temperatures"][0]) == record["steps_per_canvas"][0]
    tampered = dict(record, temperatures=[record["temperatures"][0][::-1]])  # a reversed schedule
    (tmp_path / "reversed.jsonl").write_text(json.dumps(tampered) + "\n")
    capsys.readouterr()
    assert main(["golden", "--check", str(tmp_path / "reversed.jsonl"), "--model", str(path)]) == 1
    assert "temperature at canvas 0, step 0" in capsys.readouterr().out
    run = golden_module.golden_run

    def stops_at_once(*args):  # a re-run whose trace says it stopped at step 0 (where the stopper cannot)
        got, trace = run(*args)
        trace.tensors["stopped"][0] = True
        return got, trace

    monkeypatch.setattr(golden_module, "golden_run", stops_at_once)
    assert main(["golden", "--check", str(golden), "--model", str(path)]) == 1
    assert "check stop at canvas 0, step 0, row 0" in capsys.readouterr().out
