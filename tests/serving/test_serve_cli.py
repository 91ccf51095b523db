"""`diffusiongemma serve` as users start it: a subprocess on 127.0.0.1 and a free port, asked with the `openai` client,
then terminated (bounded: 120 s to start, 60 s per request)."""

import os
import socket
import subprocess
import sys
import time

import pytest

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_checkpoint import write_checkpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(model: str, max_model_len: int):
    """`python -m diffusiongemma serve` on a free port, once it answers `GET /v1/models` (at most 120 s):
    (the process, an `openai` client for it, the model listing)."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    server = subprocess.Popen(
        [sys.executable, "-m", "diffusiongemma", "serve", "--model", model, "--port", str(port), "--device", "cpu",
         "--max-model-len", str(max_model_len)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60, max_retries=0)
    deadline = time.monotonic() + 120
    while True:
        try:
            return server, client, client.models.list()
        except openai.APIConnectionError:
            if server.poll() is not None or time.monotonic() >= deadline:
                server.kill()
                server.wait(timeout=10)
                raise AssertionError(f"the server did not start within 120 s: {server.stderr.read()}") from None
            time.sleep(0.2)


def test_serve_command_answers_the_openai_client(tmp_path):
    model = write_checkpoint(tmp_path / "ckpt")
    server, client, models = start_serve(model, 128)
    try:
        assert [m.id for m in models.data] == [model]
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=16, seed=1, extra_body={"max_denoising_steps": 2})
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 16
        with pytest.raises(openai.BadRequestError, match="max_tokens"):  # 128 tokens at most per request
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=200)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def test_bad_serve_options_are_refused_before_loading(tmp_path, capsys):
    from conftest import tiny_model

    from diffusiongemma.cli import main

    bare = tmp_path / "no_tokenizer"
    tiny_model().save_pretrained(bare)  # a model folder without tokenizer files
    cases = [
        (["--model", str(tmp_path / "nonexistent")], "does not exist"),
        (["--model", str(bare)], "holds no tokenizer"),
        (["--model", str(bare), "--tokenizer", str(tmp_path / "nope")], "--tokenizer"),
        (["--model", str(bare), "--chat-template-kwargs", "{bad"], "not valid JSON"),
        (["--model", str(bare), "--chat-template-kwargs", "[1]"], "must be a JSON object"),
    ]
    for args, message in cases:
        assert main(["serve", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and "Repo id" not in err, err
    for port in ("99999", "-1", "http"):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--model", str(bare), "--port", port])
        assert exit_.value.code == 2 and "--port" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(bare), "--decoder-window", "flash"])
    assert exit_.value.code == 2 and "--decoder-window" in capsys.readouterr().err
    from diffusiongemma.serving.engine import DiffusionModelManager

    with pytest.raises(ValueError, match="decoder_window must be one of"):
        DiffusionModelManager(force_model=str(bare), decoder_window="flash")


def test_chat_names_the_url_and_the_servers_message(capsys):
    from diffusiongemma.cli import main

    port = free_port()  # nothing listens there
    assert main(["chat", "--url", f"http://127.0.0.1:{port}", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the server at http://127.0.0.1:{port}" in err and "Traceback" not in err


@pytest.mark.parametrize("prompt", ["", "  "])
def test_chat_refuses_an_empty_prompt_naming_it(capsys, prompt):
    from diffusiongemma.cli import main

    assert main(["chat", "--url", "http://127.0.0.1:9", "--prompt", prompt]) == 2
    assert "error: --prompt is empty" in capsys.readouterr().err


def test_one_ctrl_c_stops_serve_during_a_long_request(tmp_path):
    import signal

    model = write_checkpoint(tmp_path / "ckpt")
    server, client, _ = start_serve(model, 256)
    try:
        stream = client.chat.completions.create(  # long: 14 canvases of 1000 steps
            model=model, messages=[{"role": "user", "content": "long"}], max_tokens=224, stream=True,
            extra_body={"stream_drafts": True, "max_denoising_steps": 1000, "confidence_threshold": 1e-9})
        next(iter(stream))  # the request is running
        server.send_signal(signal.SIGINT)
        rc = server.wait(timeout=60)  # the grace period is 5 s
        err = server.stderr.read()
        assert rc == 130 and "Traceback" not in err, err
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


def test_serve_compile_flags_reach_the_scheduler(tmp_path, capsys, monkeypatch):
    from conftest import tiny_model

    from diffusiongemma.cli import main
    from diffusiongemma.serving import app

    bare = tmp_path / "no_tokenizer"
    tiny_model().save_pretrained(bare)
    assert main(["serve", "--model", str(bare), "--compile", "--batch-invariant"]) == 2
    assert "--compile cannot run with --batch-invariant" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(bare), "--compile-mode", "fast"])
    assert exit_.value.code == 2 and "--compile-mode" in capsys.readouterr().err
    seen = []

    def build_app(options):
        seen.append(options.compile)
        raise RuntimeError("stop here")  # before loading anything

    monkeypatch.setattr(app, "build_app", build_app)
    monkeypatch.setattr("diffusiongemma.serving.cli.check_serve_sources", lambda model, tokenizer: None)
    for flags, expected in ((["--compile"], True), (["--compile-mode", "reduce-overhead"], {"mode": "reduce-overhead"}),
                            ([], False)):
        assert main(["serve", "--model", str(bare), *flags]) == 1 and "stop here" in capsys.readouterr().err
        assert seen.pop() == expected
