"""`compare --engine-url` against broken engines (accuracy/engine_compare.py, engine_client.py): empty answers are
judged, answers longer than max_tokens and ids that are not ids of the vocabulary are refused, a server that trickles
bytes is cut off at the request deadline, malformed input exits 2 naming it, and a run without the power to find a
deficit is inconclusive (exit 3), never a pass. Stub servers on loopback; every server is stopped by its fixture."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_engine_compare import Stub, replies, write_tiny_checkpoint

from diffusiongemma.accuracy.engine_compare import (
    ALPHA,
    MARGIN,
    MAX_DETECTABLE,
    detectable_difference,
    verdict_of,
)
from diffusiongemma.accuracy.stats import t_quantile
from diffusiongemma.cli import main
from diffusiongemma.sudoku.demo import DEMO_MODEL

pytestmark = pytest.mark.usefixtures("one_thread")
PUZZLE = "<bos>" + "." * 44 + "123456789" * 4 + "1|"  # an 83-token Sudoku-style prompt


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    if not (DEMO_MODEL / "model.safetensors").exists():
        pytest.skip("no bundled Sudoku model")
    root = tmp_path_factory.mktemp("engine_hardening")
    (root / "puzzles.txt").write_text(f"{PUZZLE}\n{PUZZLE.replace('1|', '2|')}\n")
    return {"sudoku": str(DEMO_MODEL), "tiny": write_tiny_checkpoint(root / "tiny"), "root": root,
            "puzzles": root / "puzzles.txt"}


def serve(handler_class):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


@pytest.fixture
def stub():
    handler = type("StubHandler", (Stub,), {"bodies": [], "auth": []})
    server, url = serve(handler)
    yield handler, url
    server.shutdown()
    server.server_close()


def run(capsys, *args) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["compare", *args])
    captured = capsys.readouterr()
    summary = json.loads(captured.out) if captured.out.strip().startswith("{") else {}
    return code, summary, captured.err


def on_sudoku(paths, url, capsys, *extra, samples: int = 4, max_tokens: int = 82):
    return run(capsys, "--model", paths["sudoku"], "--engine-url", url, "--prompts", str(paths["puzzles"]),
               "--samples", str(samples), "--max-tokens", str(max_tokens), "--json", *extra)


# --- empty answers count --------------------------------------------------------------------------------------------

def test_empty_answers_are_judged_not_dropped(paths, stub, capsys):
    """6 of 8 answers empty ("stop"): each is scored as an immediate EOS, which the Sudoku model finds far less
    likely than its digits, so the engine fails; every answer is counted."""
    handler, url = stub
    digits = {"choices": [{"text": "1" * 81, "finish_reason": "stop"}]}
    empty = {"choices": [{"text": "", "finish_reason": "stop"}]}
    handler.reply = replies(digits, empty, empty, empty)
    code, summary, err = on_sudoku(paths, url, capsys)
    assert summary, err
    assert summary["empty_answers"]["engine"] == 6 and summary["engine"]["answers"] == 8
    assert summary["engine"]["scored"] == 8  # none dropped
    assert sorted(a["tokens"] for a in summary["answers"]["engine"])[:6] == [1] * 6  # EOS alone
    assert code == 1 and summary["verdict"] == "fail"


def test_an_empty_answer_without_finish_reason_is_an_immediate_end(paths, stub, capsys):
    handler, url = stub
    handler.reply = {"choices": [{"text": ""}]}
    code, summary, err = on_sudoku(paths, url, capsys)
    assert summary["empty_answers"]["engine"] == 8 and summary["engine"]["scored"] == 8
    assert code == 1 and summary["logprob_difference"]["difference"] < -5


def test_an_empty_answer_that_claims_max_tokens_is_refused(paths, stub, capsys):
    handler, url = stub
    handler.reply = {"choices": [{"text": "", "finish_reason": "length"}]}
    code, _, err = on_sudoku(paths, url, capsys)
    assert code == 2 and "the answer is empty but `finish_reason` is \"length\"" in err and "prompt 0" in err


# --- max_tokens, token ids ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reply, message", [
    ({"choices": [{"text": "x", "token_ids": [5] * 3000, "finish_reason": "length"}]},
     "3000 tokens in `choices[0].token_ids`, more than the max_tokens 82"),
    ({"choices": [{"text": "1" * 40}], "usage": {"completion_tokens": 3000}},
     "`usage.completion_tokens` is 3000, more than the max_tokens 82"),
    ({"choices": [{"text": "1" * 3000, "finish_reason": "length"}]}, "the text has 3000 characters"),
])
def test_an_engine_that_ignores_max_tokens_is_refused(paths, stub, capsys, reply, message):
    handler, url = stub
    handler.reply = reply
    code, _, err = on_sudoku(paths, url, capsys)
    assert code == 2 and message in err and "ignores max_tokens" in err


@pytest.mark.parametrize("reply, message", [
    ({"choices": [{"text": "ab", "token_ids": [True, False]}]}, "`choices[0].token_ids` is not a list of integers"),
    ({"choices": [{"text": "ab", "token_ids": [-1]}]}, "`choices[0].token_ids` is not a list of integers >= 0"),
    ({"choices": [{"text": "ab", "token_ids": [5, 10**6]}]}, "holds ids outside this model's vocabulary"),
    ({"choices": [{"text": "ab", "logprobs": {"tokens": ["token_id:999999"], "token_logprobs": [-1.0]}}]},
     "`choices[0].logprobs tokens` holds ids outside"),
    ({"choices": [{"text": "ab", "finish_reason": 3}]}, "`choices[0].finish_reason` is not a string"),
    ({"choices": [{"text": "ab"}], "usage": {"completion_tokens": True}}, "`usage.completion_tokens` is not"),
])
def test_ids_that_are_not_ids_exit_2_naming_the_field(paths, stub, capsys, reply, message):
    handler, url = stub
    handler.reply = reply
    code, _, err = on_sudoku(paths, url, capsys, "--logprobs")
    assert code == 2 and message in err, err


# --- a deadline per request -----------------------------------------------------------------------------------------

class Trickle(BaseHTTPRequestHandler):
    """Lists one model, then answers a completion one byte at a time, every 0.1 s, for up to 60 s: in the body
    (`phase` "body", or chunked keep-alive blanks with "keepalive") or inside the headers ("headers")."""

    phase = "body"

    def do_GET(self):
        body = json.dumps({"data": [{"id": "stub"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        end = time.monotonic() + 60
        try:
            if self.phase == "headers":
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                while time.monotonic() < end:
                    self.wfile.write(b"X")  # a header line that never ends
                    self.wfile.flush()
                    time.sleep(0.1)
                return
            self.send_response(200)
            chunked = self.phase == "keepalive"
            self.send_header("Transfer-Encoding" if chunked else "Content-Length", "chunked" if chunked else "99999")
            self.end_headers()
            while time.monotonic() < end:
                self.wfile.write(b"1\r\n \r\n" if chunked else b" ")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:  # the client hung up: done
            pass

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("phase", ["body", "keepalive", "headers"])
def test_a_trickling_server_is_cut_off_at_the_request_deadline(paths, capsys, phase):
    server, url = serve(type("TrickleHandler", (Trickle,), {"phase": phase}))
    try:
        start = time.monotonic()
        code, _, err = on_sudoku(paths, url, capsys, "--request-timeout", "1.5")
        took = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2 and "sent no complete answer within 1.5 s (--request-timeout)" in err, err
    assert took < 30  # model load + one request's deadline, not the server's 60 s


# --- malformed input ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, message", [
    ("not a url", "must be an http:// or https:// URL with a host"),
    ("ftp://127.0.0.1/v1", "must be an http:// or https:// URL"),
    ("http://", "must be an http:// or https:// URL with a host"),
    ("http://127.0.0.1:99999/v1", "is not a URL"),
])
def test_a_bad_url_exits_2_naming_it(paths, capsys, url, message):
    code, _, err = on_sudoku(paths, url, capsys)
    assert code == 2 and "--engine-url" in err and message in err, err


@pytest.mark.parametrize("lines, message", [
    ('{"prompt": "a"}\nnot json\n', ":2: not JSON"),
    ('[1]\n', ':1: expected an object with a non-empty string "prompt"'),
    ('{"prompt": 5}\n', ':1: expected an object with a non-empty string "prompt"'),
    ('{"text": "a"}\n', ':1: expected an object'),
    ('{"prompt": "  "}\n', ':1: expected an object'),
])
def test_bad_prompt_lines_exit_2_naming_the_line(paths, capsys, lines, message):
    prompts = paths["root"] / "bad.jsonl"
    prompts.write_text(lines)
    code, _, err = run(capsys, "--model", paths["sudoku"], "--engine-url", "http://127.0.0.1:9/v1", "--prompts",
                       str(prompts))
    assert code == 2 and f"{prompts}{message}" in err, err


def test_a_prompt_the_model_cannot_answer_exits_2_naming_it(paths, capsys):
    code, _, err = on_sudoku(paths, "http://127.0.0.1:9/v1", capsys, max_tokens=1000)
    assert code == 2 and "prompt 1 (83 tokens) + --max-tokens 1000" in err and "max_position_embeddings" in err
    code, _, err = on_sudoku(paths, "http://127.0.0.1:9/v1", capsys, "--chat")  # the Sudoku tokenizer: no template
    assert code == 2 and "prompt 1: the tokenizer cannot apply its chat template" in err


@pytest.mark.parametrize("flag, value", [("--request-timeout", "0"), ("--request-timeout", "nan"),
                                         ("--power", "1"), ("--power", "0.2"), ("--max-detectable", "-1")])
def test_bad_options_exit_2(paths, capsys, flag, value):
    with pytest.raises(SystemExit) as error:
        main(["compare", "--model", paths["sudoku"], "--engine-url", "http://127.0.0.1:9/v1", flag, value])
    assert error.value.code == 2 and flag in capsys.readouterr().err


# --- power ----------------------------------------------------------------------------------------------------------

def test_minimum_detectable_difference_worked_example():
    # MDE = MARGIN + (t_{1-ALPHA, df} + t_{power, df}) * SE; df 10: t_0.999 = 4.1437, t_0.8 = 0.8791
    d = {"difference": -0.047, "se": 0.072, "df": 10.0}
    assert t_quantile(1 - ALPHA, 10) == pytest.approx(4.1437, abs=1e-3)
    assert detectable_difference(d) == pytest.approx(MARGIN + (4.1437 + 0.8791) * 0.072, abs=1e-3)  # 0.3816
    assert detectable_difference(d, power=0.5) == pytest.approx(MARGIN + 4.1437 * 0.072, abs=1e-3)
    # the probe's run (random tiny model, post-feedforward norms x3, 3 prompts x 4 answers): inconclusive, not a pass
    assert verdict_of({**d, "detectable": detectable_difference(d)}) == "inconclusive"
    # the same difference with a small SE: the test has the power, and it fails the engine
    sharp = {"difference": -0.047, "se": 0.002, "df": 30.0}
    assert verdict_of({**sharp, "detectable": detectable_difference(sharp)}) == "fail"
    tiny = {"difference": -0.001, "se": 0.002, "df": 30.0}
    assert detectable_difference(tiny) < MAX_DETECTABLE and verdict_of({**tiny, "detectable":
                                                                         detectable_difference(tiny)}) == "pass"
    flat = {"difference": 0.0, "se": 0.0, "df": None}  # no variance: d alone decides, MDE is the margin
    assert detectable_difference(flat) == MARGIN and verdict_of({**flat, "detectable": MARGIN}) == "pass"
    assert verdict_of({"difference": None, "se": None, "df": None, "detectable": None}) == "inconclusive"
    # a larger --max-detectable turns the under-powered run into a pass; a significant deficit stays a fail
    assert verdict_of({**d, "detectable": detectable_difference(d)}, max_detectable=0.5) == "pass"


def test_the_verdict_and_the_detectable_difference_are_reported(paths, stub, capsys):
    """A constant (wrong) answer: with 4 samples per prompt it fails; with 2 the Welch df is about 1 and even a
    9-nat deficit is not significant at 0.001, so the run is inconclusive (exit 3) and says what it could detect."""
    handler, url = stub
    handler.reply = {"choices": [{"text": "", "finish_reason": "stop"}]}
    code, summary, _ = on_sudoku(paths, url, capsys)
    d = summary["logprob_difference"]
    assert code == 1 and summary["verdict"] == "fail" and not summary["passed"] and d["power"] == 0.8
    code, summary, _ = on_sudoku(paths, url, capsys, samples=2)
    d = summary["logprob_difference"]
    assert code == 3 and summary["verdict"] == "inconclusive" and not summary["passed"]
    assert d["difference"] < -5 and d["detectable"] > 1
    capsys.readouterr()
    assert main(["compare", "--model", paths["sudoku"], "--engine-url", url, "--prompts", str(paths["puzzles"]),
                 "--samples", "2", "--max-tokens", "82"]) == 3
    table = capsys.readouterr().out
    assert "minimum detectable difference" in table and "INCONCLUSIVE" in table
