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


def test_serve_command_answers_the_openai_client(tmp_path):
    model = write_checkpoint(tmp_path / "ckpt")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    server = subprocess.Popen(
        [sys.executable, "-m", "diffusiongemma", "serve", "--model", model, "--port", str(port), "--device", "cpu",
         "--max-model-len", "128"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60, max_retries=0)
        deadline = time.monotonic() + 120
        while True:
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert server.poll() is None, server.stderr.read()
                assert time.monotonic() < deadline, "the server did not start within 120 s"
                time.sleep(0.2)
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
