"""diffusiongemma serve (serving/): the official `openai` client against a running server on 127.0.0.1, on a tiny model.

Every request's text is compared with `model.generate(prompt, sampling="fast", seed=s)` run alone on the same model.
All network calls carry timeouts; each server is stopped at the end of its fixture.
"""

import threading
import time

import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_checkpoint import write_checkpoint  # noqa: E402

from diffusiongemma import EntropyBoundSamplerConfig  # noqa: E402
from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("serve_ckpt"))


def start(checkpoint, **options):
    served = build_app(ServeOptions(model=checkpoint, max_model_len=256, **options))
    server = BackgroundServer(served.app).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    return served, server, client


@pytest.fixture(scope="module")
def live(checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    served, server, client = start(checkpoint, max_batch_size=4, max_queue=16)
    yield served, client, checkpoint
    server.stop()
    served.state.shutdown()
    torch.set_num_threads(threads)


def chat_ids(tokenizer, text: str) -> torch.Tensor:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]


def solo_text(served, text: str, seed: int, max_tokens: int, **extra) -> str:
    """What `generate` gives for this chat message run alone: at most max_tokens new tokens, up to the first EOS."""
    model, tokenizer = served.model, served.tokenizer
    ids = chat_ids(tokenizer, text)
    settings = dict(extra)
    if "entropy_bound" in settings:
        settings["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=settings.pop("entropy_bound"))
    out = model.generate(ids, sampling="fast", seed=seed, max_new_tokens=max_tokens, **settings)
    new = out.sequences[0, ids.shape[1]:].tolist()[:max_tokens]
    if 1 in new:
        new = new[: new.index(1) + 1]
    return tokenizer.decode(new, skip_special_tokens=True)


def ask(client, model, text, seed, max_tokens=32, **extra):
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                           max_tokens=max_tokens, seed=seed, extra_body=extra or None)
    return reply.choices[0].message.content


def test_models_and_chat_equal_a_solo_run(live):
    served, client, model = live
    assert [m.id for m in client.models.list().data] == [model]
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=40, seed=5)
    assert reply.choices[0].message.content == solo_text(served, "hello", 5, 40)
    assert reply.usage.completion_tokens <= 40
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_legacy_completion(live):
    served, client, model = live
    reply = client.completions.create(model=model, prompt="abc", max_tokens=20, seed=9)
    ids = served.tokenizer("abc", return_tensors="pt")["input_ids"]
    new = served.model.generate(ids, sampling="fast", seed=9, max_new_tokens=20).sequences[0, ids.shape[1]:]
    new = new.tolist()[:20]
    new = new[: new.index(1) + 1] if 1 in new else new
    assert reply.choices[0].text == served.tokenizer.decode(new, skip_special_tokens=True)


def test_stream_without_drafts_is_an_ordinary_stream(live):
    served, client, model = live
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hey"}],
                                                 max_tokens=48, seed=2, stream=True))
    assert not any((c.model_extra or {}).get("draft") for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == solo_text(served, "hey", 2, 48)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_stream_with_drafts(live):
    served, client, model = live
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hey"}], max_tokens=48, seed=2, stream=True,
        extra_body={"stream_drafts": True, "max_denoising_steps": 4}))
    drafts = [(c.model_extra or {}).get("draft") for c in chunks]
    drafts = [d for d in drafts if d]
    assert drafts and all(d["provisional"] is True for d in drafts)
    # drafts come step by step within each canvas, and never carry content deltas
    assert drafts[0]["canvas"] == 0 and drafts[0]["step"] == 1
    assert all(d["step"] <= 4 for d in drafts)
    assert all(not c.choices[0].delta.content for c in chunks if (c.model_extra or {}).get("draft"))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == solo_text(served, "hey", 2, 48, max_denoising_steps=4)
    # each committed canvas equals the draft of its last step (the argmax canvas is what commits)
    last_draft = {}
    for d in drafts:
        last_draft[d["canvas"]] = d["text"]
    commits = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert commits[0] == last_draft[0][: len(commits[0])]


@pytest.mark.parametrize("clients", [2, 8])
def test_concurrent_requests_equal_solo_runs(live, clients):
    served, client, model = live
    # different prompts, seeds, lengths and diffusion settings share the pool (4 rows: 8 clients also refill it)
    jobs = [(f"msg {i}" * (1 + i % 3), 100 + i, 16 * (1 + i % 3),
             {"max_denoising_steps": 3 + i % 4, "entropy_bound": 0.05 * (1 + i % 3), "t_max": 0.8 + 0.1 * (i % 2)})
            for i in range(clients)]
    results = [None] * clients

    def run(i):
        text, seed, max_tokens, extra = jobs[i]
        results[i] = ask(client, model, text, seed, max_tokens, **extra)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert served.scheduler.peak_rows > 1  # requests really shared passes
    for (text, seed, max_tokens, extra), got in zip(jobs, results):
        assert got == solo_text(served, text, seed, max_tokens, **extra)


def wait_for(condition, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_stream_disconnect_cancels_the_row(live):
    served, client, model = live
    dropped = served.scheduler.dropped
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "long"}], max_tokens=160, seed=1, stream=True,
        extra_body={"stream_drafts": True, "max_denoising_steps": 50, "confidence_threshold": 1e-9})
    for chunk in stream:
        if (chunk.model_extra or {}).get("draft"):
            break  # generating now
    stream.close()
    assert wait_for(lambda: served.scheduler.dropped == dropped + 1 and served.scheduler.active_rows == 0)


def test_non_streaming_disconnect_cancels_the_row(live):
    served, client, model = live
    dropped = served.scheduler.dropped
    impatient = client.with_options(timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "long"}], max_tokens=160, seed=1,
            extra_body={"max_denoising_steps": 50, "confidence_threshold": 1e-9})
    assert wait_for(lambda: served.scheduler.dropped == dropped + 1 and served.scheduler.active_rows == 0)


def test_reference_sampling_runs_alone_like_generate(live):
    served, client, model = live
    got = ask(client, model, "ref", 3, 32, sampling="reference")
    ids = chat_ids(served.tokenizer, "ref")
    torch.manual_seed(3)  # reference mode draws from the global RNG, seeded by the request's seed
    new = served.model.generate(ids, sampling="reference", max_new_tokens=32).sequences[0, ids.shape[1]:].tolist()
    new = new[: new.index(1) + 1] if 1 in new else new
    assert got == served.tokenizer.decode(new[:32], skip_special_tokens=True)


def test_chat_command_shows_drafts_and_the_reply(live, capsys):
    from diffusiongemma.cli import main

    served, client, model = live
    url = str(client.base_url).removesuffix("/v1/")
    assert main(["chat", "--url", url, "--prompt", "hello", "--seed", "5", "--max-tokens", "40"]) == 0
    out, err = capsys.readouterr()
    assert out == solo_text(served, "hello", 5, 40) + "\n"  # not a terminal: stdout holds only the reply
    drafts = [line for line in err.splitlines() if line.startswith("[canvas ")]
    assert drafts and drafts[0].startswith("[canvas 1, step 1] ") and "\x1b" not in out + err


def test_stop_string_ends_the_reply(live):
    served, client, model = live
    full = solo_text(served, "stop test", 4, 48)
    stop = full[5:7]
    got = ask(client, model, "stop test", 4, 48, stop=[stop])
    assert got == full[: full.index(stop)]


@pytest.mark.parametrize("field, value", [
    ("max_denoising_steps", 0), ("entropy_bound", -1.0), ("t_min", "x"), ("t_max", 0.1), ("stability_threshold", 1.5),
    ("confidence_threshold", 0), ("sampling", "greedy"), ("stream_drafts", "yes"), ("seed", -1), ("max_tokens", 10**6),
    ("stop", ["a", "b", "c", "d", "e"]),
])
def test_bad_values_are_400_naming_the_field(live, field, value):
    _, client, model = live
    body = {"model": model, "messages": [{"role": "user", "content": "x"}], field: value}
    with pytest.raises(openai.BadRequestError) as error:
        client.post("/chat/completions", body=body, cast_to=object)
    assert f"`{field}`" in error.value.message and error.value.body["param"] == field


def test_unknown_field_is_refused_and_temperature_accepted(live):
    served, client, model = live
    with pytest.raises(openai.UnprocessableEntityError):
        client.post("/chat/completions", body={"model": model, "messages": [], "denoise_harder": 1}, cast_to=object)
    got = ask(client, model, "hello", 5, 40, temperature=0.3, top_p=0.5)  # accepted, reported unused
    assert got == solo_text(served, "hello", 5, 40)


def test_queue_limit_gives_429(checkpoint):
    served, server, client = start(checkpoint, max_batch_size=1, max_queue=1)
    slow = dict(max_tokens=160, extra_body={"stream_drafts": True, "max_denoising_steps": 50,
                                            "confidence_threshold": 1e-9})
    try:
        running = client.chat.completions.create(model=checkpoint, messages=[{"role": "user", "content": "a"}],
                                                 stream=True, **slow)
        for chunk in running:  # wait until it holds the only row
            if (chunk.model_extra or {}).get("draft"):
                break
        waiting = client.chat.completions.create(model=checkpoint, messages=[{"role": "user", "content": "b"}],
                                                 stream=True, **slow)
        assert wait_for(lambda: served.scheduler.waiting == 1)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=checkpoint, messages=[{"role": "user", "content": "c"}], stream=True,
                                           **slow)
        running.close()
        waiting.close()
    finally:
        server.stop()
        served.state.shutdown()


def test_fp8_checkpoint_is_served_with_our_class(tmp_path):
    from quantization.ct_checkpoint import REGEX_IGNORE, write_compressed_checkpoint

    from conftest import tiny_model, tiny_tokenizer
    from diffusiongemma.quantization.fp8 import FP8Linear

    write_compressed_checkpoint(tiny_model(seed=3), tmp_path, "FP8_DYNAMIC", REGEX_IGNORE)
    tiny_tokenizer().save_pretrained(tmp_path)
    served, server, client = start(str(tmp_path), max_batch_size=2)
    try:
        assert isinstance(served.model.model.decoder.layers[0].self_attn.q_proj, FP8Linear)
        reply = client.completions.create(model=str(tmp_path), prompt="abc", max_tokens=16, seed=2,
                                          extra_body={"max_denoising_steps": 3})
        ids = served.tokenizer("abc", return_tensors="pt")["input_ids"]
        new = served.model.generate(ids, sampling="fast", seed=2, max_new_tokens=16, max_denoising_steps=3)
        expected = served.tokenizer.decode(new.sequences[0, ids.shape[1]:], skip_special_tokens=True)
        assert reply.choices[0].text == expected
    finally:
        server.stop()
        served.state.shutdown()
