"""`diffusiongemma compare --engine-url` (accuracy/engine_compare.py) against our own `serve` on loopback, and
against stub servers that answer wrongly. Every request has a timeout; every server is stopped by its fixture."""

import json
import random
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import tiny_model, tiny_tokenizer, write_generation_config

from diffusiongemma.accuracy.engine_compare import (
    ALPHA,
    MARGIN,
    AnswerScore,
    margin_p_value,
    stratified_difference,
    verdict,
)
from diffusiongemma.accuracy.stats import t_cdf
from diffusiongemma.cli import main
from diffusiongemma.sudoku.demo import DEMO_MODEL
from diffusiongemma.sudoku.puzzles import make_puzzle

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
pytest.importorskip("uvicorn")

from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402


def write_tiny_checkpoint(path) -> str:
    """The serving tests' sharp tiny model, with a tokenizer whose filler tokens are added tokens, so an answer's
    text tokenizes back into its own ids."""
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.save_pretrained(path)
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens([f"<x{i}>" for i in range(99, 128)])
    tokenizer.save_pretrained(path)
    write_generation_config(path, eos_token_id=1, pad_token_id=0, max_new_tokens=16, max_denoising_steps=6,
                            stability_threshold=0, confidence_threshold=0.8)
    return str(path)


def write_broken_sudoku(path) -> str:
    """The bundled Sudoku model with every weight matrix of its layers quantized to one bit (sign times mean
    magnitude): a broken engine."""
    from transformers import AutoTokenizer

    from diffusiongemma import DiffusionGemmaForBlockDiffusion

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_MODEL)
    with torch.no_grad():
        for w in model.get_decoder().layers.parameters():
            if w.dim() >= 2:
                w.copy_(w.sign() * w.abs().mean())
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(DEMO_MODEL).save_pretrained(path)
    shutil.copy(DEMO_MODEL / "generation_config.json", path)
    return str(path)


def write_sudoku_with_window(path, window: int) -> str:
    """The bundled Sudoku model with its sliding layers' window cut from 256 to `window`: a prompt (83 tokens) and
    canvas (82) longer than the window, so the symmetric-window switch changes what a denoising pass sees, on a
    model still good enough (argmax agreement about 0.8) that its answers are fixed points of the reference."""
    shutil.copytree(DEMO_MODEL, path)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["sliding_window"] = window
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Servers on loopback: the Sudoku model, a broken copy of it, the tiny model; and prompts files."""
    if not (DEMO_MODEL / "model.safetensors").exists():
        pytest.skip("no bundled Sudoku model")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("engine_compare")
    paths = {"sudoku": str(DEMO_MODEL), "broken": write_broken_sudoku(root / "broken"),
             "tiny": write_tiny_checkpoint(root / "tiny")}
    running = {}
    for name, path in paths.items():
        app = build_app(ServeOptions(model=path, max_model_len=256))
        running[name] = (app, BackgroundServer(app.app).start())
    paths["window64"] = write_sudoku_with_window(root / "window64", 64)
    for window in ("reference", "symmetric"):
        app = build_app(ServeOptions(model=paths["window64"], max_model_len=256, decoder_window=window))
        running[f"window64-{window}"] = (app, BackgroundServer(app.app).start())
    rng = random.Random(0)
    (root / "puzzles.txt").write_text("".join(f"<bos>{make_puzzle(rng, 40)[0].replace('0', '.')}|\n"
                                              for _ in range(2)))
    (root / "prompts.txt").write_text("Hello there\nThe quick brown fox\n")
    (root / "more_puzzles.txt").write_text("".join(f"<bos>{make_puzzle(rng, 40)[0].replace('0', '.')}|\n"
                                                   for _ in range(4)))
    yield {"paths": paths, "urls": {name: server.url + "/v1" for name, (_, server) in running.items()},
           "puzzles": root / "puzzles.txt", "prompts": root / "prompts.txt", "more_puzzles": root / "more_puzzles.txt"}
    for app, server in running.values():
        server.stop()
        app.state.shutdown()
    torch.set_num_threads(threads)


def compare(model, url, prompts, capsys, *extra, max_tokens: int = 82) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["compare", "--model", model, "--engine-url", url, "--prompts", str(prompts), "--samples", "3",
                 "--max-tokens", str(max_tokens), "--json", *extra])
    captured = capsys.readouterr()
    compare.err = captured.err  # the last run's stderr
    return code, json.loads(captured.out) if captured.out.strip().startswith("{") else {}


def test_serve_on_the_same_model_passes(served, capsys):
    """The Sudoku model served: its answers are as likely under the reference as the reference's own."""
    code, summary = compare(served["paths"]["sudoku"], served["urls"]["sudoku"], served["puzzles"], capsys)
    assert code == 0 and summary["passed"], summary.get("logprob_difference")
    assert summary["engine"]["answers"] == summary["reference"]["answers"] == 6
    assert summary["tokens_from"] == "text" and summary["served_model"] == served["paths"]["sudoku"]
    assert summary["engine"]["argmax_agree"] > 0.99 and summary["reference"]["argmax_agree"] > 0.99
    d = summary["logprob_difference"]
    assert d["ci95"][0] <= d["difference"] <= d["ci95"][1] and abs(d["difference"]) < 0.01


def test_serve_on_a_broken_model_fails(served, capsys):
    code, summary = compare(served["paths"]["sudoku"], served["urls"]["broken"], served["puzzles"], capsys)
    assert code == 1 and not summary["passed"]
    d = summary["logprob_difference"]
    assert d["difference"] < -1 and d["ci95"][1] < 0 and d["p_value"] < ALPHA
    assert summary["engine"]["argmax_agree"] < 0.5  # its digits are mostly not the reference's fixed point


def test_a_random_tiny_model_served_in_chat_mode_is_inconclusive_with_a_table(served, capsys):
    """2 prompts x 2 samples of a random model (answers' log-probs spread over ~1 nat): not significantly worse, but
    the run could not have found even a large deficit, so it is inconclusive (exit 3), never a pass; with a
    --max-detectable above its minimum detectable difference it passes."""
    capsys.readouterr()
    args = ["compare", "--model", served["paths"]["tiny"], "--engine-url", served["urls"]["tiny"],
            "--prompts", str(served["prompts"]), "--samples", "2", "--max-tokens", "16", "--chat"]
    assert main(args) == 3
    table = capsys.readouterr().out
    assert "chat" in table and "95% CI" in table and "INCONCLUSIVE" in table and "PASS" not in table
    assert "minimum detectable difference" in table
    assert main([*args, "--max-detectable", "1000", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    d = summary["logprob_difference"]
    assert summary["verdict"] == "pass" and summary["passed"] and d["detectable"] > 0.1
    assert summary["test"]["power"] == d["power"] == 0.8 and summary["test"]["max_detectable"] == 1000


def test_an_unreachable_server_exits_2_naming_it(served, capsys):
    model, prompts = served["paths"]["sudoku"], served["puzzles"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code, _ = compare(model, f"http://127.0.0.1:{port}/v1", prompts, capsys)
    assert code == 2
    assert f"cannot reach http://127.0.0.1:{port}/v1/models" in compare.err


class Stub(BaseHTTPRequestHandler):
    """A server that lists one model and answers every completion with `reply` (a dict, or raw bytes)."""

    reply: object = None

    def do_GET(self):
        self._send(json.dumps({"object": "list", "data": [{"id": "stub"}]}).encode())

    def do_POST(self):
        type(self).bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        type(self).auth.append(self.headers.get("Authorization"))
        reply = type(self).reply
        reply = reply() if callable(reply) else reply  # `replies(...)`: one per request, in turn
        self._send(reply if isinstance(reply, bytes) else json.dumps(reply).encode())

    def _send(self, body: bytes):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    handler = type("StubHandler", (Stub,), {"bodies": [], "auth": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("reply, message", [
    ({"choices": [{"text": 5}]}, "`choices[0].text` is missing or not a string"),
    ({"id": "x"}, "the reply has no `choices[0]`"),
    (b"<html>busy</html>", "is not JSON"),
    ({"choices": [{"text": "ab", "token_ids": ["a"]}]}, "`choices[0].token_ids` is not a list of integers"),
])
def test_a_malformed_answer_exits_2_naming_the_field(served, stub, capsys, reply, message):
    model, prompts = served["paths"]["sudoku"], served["puzzles"]
    handler, url = stub
    handler.reply = reply
    code, _ = compare(model, url, prompts, capsys)
    assert code == 2
    err = compare.err
    assert message in err and url in err


def test_returned_token_ids_are_used_instead_of_the_text(served, stub, capsys):
    model, prompts = served["paths"]["sudoku"], served["puzzles"]
    handler, url = stub
    handler.reply = {"choices": [{"text": "not these", "token_ids": [4, 5, 6], "finish_reason": "stop"}]}
    code, summary = compare(model, url, prompts, capsys, "--api-key", "sekrit", "--seed", "7")
    assert handler.auth == ["Bearer sekrit"] * 6
    assert [b["seed"] for b in handler.bodies] == [7, 8, 9] * 2 and {b["model"] for b in handler.bodies} == {"stub"}
    assert {b["max_tokens"] for b in handler.bodies} == {82} and "prompt" in handler.bodies[0]
    assert summary["tokens_from"] == "token_ids"
    assert summary["text_id_mismatches"] == list(range(6))  # "not these" is not ids 4, 5, 6
    assert {a["tokens"] for a in summary["answers"]["engine"]} == {4}  # 3 ids + EOS (it stopped)
    assert code == 1  # a constant answer is far less likely under the reference than its own


def scores(prompt_means: dict[int, list[float]]) -> list[AnswerScore]:
    return [AnswerScore(p, s, 8, 1, x, 0.5) for p, xs in prompt_means.items() for s, x in enumerate(xs)]


def test_stratified_difference_worked_example():
    # prompt 0: engine (-1, -3) mean -2, var 2; reference (-1, -1) mean -1, var 0 -> d0 = -1
    # prompt 1: engine (-2, -2) mean -2, var 0; reference (-3, -1) mean -2, var 2 -> d1 = 0
    # d = -0.5, SE = sqrt(2/2 + 2/2) / 2 = 0.7071, t = -0.7071; df = (1 + 1)^2 / (1/1 + 1/1) = 2
    d = stratified_difference(scores({0: [-1, -3], 1: [-2, -2]}), scores({0: [-1, -1], 1: [-3, -1]}),
                              "mean_logprob")
    assert d["difference"] == pytest.approx(-0.5) and d["se"] == pytest.approx(0.70711, abs=1e-5)
    assert d["t"] == pytest.approx(-0.70711, abs=1e-5) and d["df"] == pytest.approx(2.0)
    assert d["p_value"] == pytest.approx(0.27639, abs=1e-4)  # P(T_2 <= -0.7071) = (1 - 0.7071 / sqrt(2.5)) / 2
    assert verdict(d)
    # the verdict is a non-inferiority test: p = P(T_df <= (d + MARGIN) / SE)
    assert margin_p_value(d) == pytest.approx(t_cdf((-0.5 + MARGIN) / d["se"], 2.0))
    assert not verdict({"difference": -1.0, "se": 0.2, "df": 30.0})  # 4.9 SE beyond the margin
    assert verdict({"difference": -1.0, "se": 0.5, "df": 30.0})  # 2 SE: not significant at 0.001
    # a tiny difference with (near) no variance: the plain t is enormous, the margin keeps it a pass
    tiny = {"difference": -5e-5, "se": 2e-6, "df": 3.0}
    assert t_cdf(tiny["difference"] / tiny["se"], 3.0) < ALPHA and verdict(tiny)
    assert margin_p_value({"difference": -MARGIN * 1.0001, "se": 0.0086, "df": 3.0}) > 0.4  # at the margin: ~0.5
    # no variance at all: decided by d alone
    flat = stratified_difference(scores({0: [-2, -2]}), scores({0: [-1, -1]}), "mean_logprob")
    assert flat["p_value"] == 0.0 and not verdict(flat)
    assert verdict(stratified_difference(scores({0: [-1.01, -1.01]}), scores({0: [-1, -1]}), "mean_logprob"))


def test_t_distribution_against_known_values():
    from diffusiongemma.accuracy.stats import betainc, t_cdf, t_quantile

    assert betainc(1, 1, 0.5) == pytest.approx(0.5)
    assert t_cdf(-2.015, 5) == pytest.approx(0.05, abs=1e-5)  # the t table's 95 % point at 5 df
    assert t_cdf(0.0, 7) == 0.5 and t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=1e-4)


def test_compare_needs_exactly_one_of_trace_and_engine_url(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("hi\n")
    assert main(["compare", "--model", str(DEMO_MODEL)]) == 2
    assert "compare needs --trace DIR" in capsys.readouterr().err
    assert main(["compare", "--model", str(DEMO_MODEL), "--engine-url", "http://127.0.0.1:9/v1", "--prompts",
                 str(tmp_path / "p.txt"), "--trace", str(tmp_path)]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["compare", "--model", str(DEMO_MODEL), "--engine-url", "http://127.0.0.1:9/v1"]) == 2
    assert "needs --prompts" in capsys.readouterr().err
    assert main(["compare", "--model", str(DEMO_MODEL), "--engine-url", "http://127.0.0.1:9/v1", "--prompts",
                 str(tmp_path / "p.txt"), "--samples", "0"]) == 2
    assert "--samples must be a positive integer" in capsys.readouterr().err


def test_serve_with_the_symmetric_window_is_reported_as_such(served, capsys):
    """Served under the symmetric-window switch: the /v1/models entry says so, the comparison names it and fails
    under the reference window, and passes when the reference runs the same switch (--decoder-window symmetric).
    The same checkpoint served with the reference window declares that, and passes."""
    model, prompts = served["paths"]["window64"], served["more_puzzles"]
    url = served["urls"]["window64-symmetric"]
    code, summary = compare(model, url, prompts, capsys, "--samples", "4")
    assert summary["decoder_window"] == {"engine": "symmetric", "reference": "reference"}
    assert code == 1 and not summary["passed"], summary["logprob_difference"]
    assert summary["logprob_difference"]["difference"] < -1
    assert summary["engine"]["argmax_agree"] < summary["reference"]["argmax_agree"] - 0.3
    capsys.readouterr()
    assert main(["compare", "--model", model, "--engine-url", url, "--prompts", str(prompts), "--samples", "2",
                 "--max-tokens", "82"]) == 1
    table = capsys.readouterr().out
    assert "the server declares decoder_window 'symmetric'" in table and "FAIL" in table
    # the agreeing runs: this copy's answers are far from all fixed points (measured SE 0.14 and 0.63 nats, Welch df
    # about 3 to 20), so 4 puzzles x 4 samples cannot detect 0.25 nats: not worse, and pass (exit 0) or, with too
    # little power, inconclusive (exit 3), never a fail
    code, summary = compare(model, url, prompts, capsys, "--samples", "4", "--decoder-window", "symmetric")
    assert summary["decoder_window"] == {"engine": "symmetric", "reference": "symmetric"}
    assert code in (0, 3) and summary["verdict"] != "fail", summary["logprob_difference"]
    code, summary = compare(model, served["urls"]["window64-reference"], prompts, capsys, "--samples", "4")
    assert summary["decoder_window"] == {"engine": "reference", "reference": "reference"}
    assert code in (0, 3) and summary["verdict"] != "fail", summary["logprob_difference"]


def test_returned_logprobs_name_the_ids_and_are_set_beside_the_reference(served, stub, capsys):
    """vLLM's --return-tokens-as-token-ids form: the "token_id:N" tokens are the answer's ids, and the reported
    log-probabilities are compared with the reference's for the same tokens (never judged)."""
    model, prompts = served["paths"]["sudoku"], served["puzzles"]
    handler, url = stub
    ids = [5, 6, 7, 8]
    handler.reply = {"choices": [{"text": "1234", "finish_reason": "length", "logprobs": {
        "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5, -0.5, None, -0.5]}}]}
    code, summary = compare(model, url, prompts, capsys, "--logprobs")
    assert {b["logprobs"] for b in handler.bodies} == {1}
    assert summary["tokens_from"] == "logprobs" and summary["text_id_mismatches"] == []
    assert {a["tokens"] for a in summary["answers"]["engine"]} == {4}
    reported = summary["reported_logprobs"]
    assert reported["answers"] == 6 and reported["tokens"] == 6 * 3  # the null one is left out
    assert reported["mean_reported"] == pytest.approx(-0.5)
    assert reported["mean_abs_difference"] >= abs(reported["mean_reported"] - reported["mean_reference"]) - 1e-9
    assert reported["max_abs_difference"] >= reported["mean_abs_difference"]
    assert code == 1  # a constant answer is still judged by its likelihood under the reference, not its logprobs
    capsys.readouterr()
    main(["compare", "--model", model, "--engine-url", url, "--prompts", str(prompts), "--samples", "1",
          "--max-tokens", "8", "--logprobs"])
    assert "reported logprobs (6 tokens of 2 answers)" in capsys.readouterr().out


def test_chat_logprobs_tokens_as_text_pieces(served, stub, capsys):
    model, prompts = served["paths"]["tiny"], served["prompts"]  # a character-level tokenizer with a chat template
    handler, url = stub
    content = [{"token": t, "logprob": -0.25, "bytes": list(t.encode())} for t in "abc"]
    handler.reply = {"choices": [{"message": {"role": "assistant", "content": "abc"}, "finish_reason": "length",
                                  "logprobs": {"content": content}}]}
    code, summary = compare(model, url, prompts, capsys, "--logprobs", "--chat")
    assert summary, compare.err
    assert {b["logprobs"] for b in handler.bodies} == {True}
    assert summary["tokens_from"] == "logprobs" and summary["reported_logprobs"]["tokens"] == 18
    # tokens that do not spell the text name nothing for sure: the text is tokenized again, nothing is compared
    handler.reply["choices"][0]["message"]["content"] = "abd"
    code, summary = compare(model, url, prompts, capsys, "--logprobs", "--chat")
    assert summary["tokens_from"] == "text" and summary["reported_logprobs"] is None


@pytest.mark.parametrize("logprobs, message", [
    ("yes", "`choices[0].logprobs` is not an object"),
    ({"tokens": ["1"], "token_logprobs": []}, "are not two lists of the same length"),
    ({"tokens": [1], "token_logprobs": [-1.0]}, "a token is not a string"),
    ({"tokens": ["1"], "token_logprobs": [0.5]}, "a log-probability is not a number <= 0"),
])
def test_malformed_logprobs_exit_2_naming_the_field(served, stub, capsys, logprobs, message):
    handler, url = stub
    handler.reply = {"choices": [{"text": "1", "logprobs": logprobs}]}
    code, _ = compare(served["paths"]["sudoku"], url, served["puzzles"], capsys, "--logprobs")
    assert code == 2 and message in compare.err and "prompt 0, sample 0" in compare.err


def test_our_serve_reports_logprobs_and_compare_reads_them(served, capsys):
    """Our server serves logprobs by the rule compare scores with (serving/logprobs.py): they read back equal."""
    code, summary = compare(served["paths"]["sudoku"], served["urls"]["sudoku"], served["puzzles"], capsys, "--logprobs")
    assert code == 0 and summary["tokens_from"] == "logprobs"
    assert summary["reported_logprobs"]["mean_abs_difference"] < 1e-3


def replies(*items):
    """A stub reply that changes from request to request: the items in turn (cycled)."""
    state = {"n": 0}

    def reply():
        state["n"] += 1
        return items[(state["n"] - 1) % len(items)]

    return reply
