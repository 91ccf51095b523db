"""serving/drafts.py: the draft fields of a request (`stream_drafts`, `draft_confidence`, `diffusion_frame`), the
per-position confidence 1 - H / ln V, and the chunks a live server streams with them, checked against the trace of
the same request run alone through `model.generate`."""

import json
import math

import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_checkpoint import STEPS, write_checkpoint  # noqa: E402

from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402
from diffusiongemma.serving.drafts import DraftOptions, DraftText, draft_confidence, draft_options, with_draft  # noqa: E402
from diffusiongemma.serving.settings import BadRequestField  # noqa: E402

V = 128  # the tiny model's vocabulary


def test_confidence_is_one_minus_the_normalized_entropy():
    ln_v = math.log(V)
    # one-hot: H = 0 -> 1; uniform: H = ln V -> 0; half of it -> 0.5; above ln V (rounding) clamps to 0
    entropy = torch.tensor([[0.0, ln_v, ln_v / 2, ln_v * 1.01, 0.25 * ln_v]])
    assert draft_confidence(entropy, V) == [1.0, 0.0, 0.5, 0.0, 0.75]


@pytest.mark.parametrize("body, field, message", [
    ({"draft_confidence": 1, "stream": True}, "draft_confidence", "true or false"),
    ({"diffusion_frame": "yes", "stream": True}, "diffusion_frame", "true or false"),
    ({"draft_confidence": True}, "draft_confidence", "stream: true"),
    ({"diffusion_frame": True, "stream": False}, "diffusion_frame", "stream: true"),
    ({"stream_drafts": True}, "stream_drafts", "stream: true"),  # a JSON response would drop them
])
def test_bad_draft_fields_name_the_field(body, field, message):
    with pytest.raises(BadRequestField, match=message) as error:
        draft_options(body, per_row_sampler=True, bad_field=BadRequestField)
    assert error.value.field == field


def test_confidence_needs_the_row_pool():
    with pytest.raises(BadRequestField, match="sampling='reference' runs alone") as error:
        draft_options({"draft_confidence": True, "stream": True, "sampling": "reference"}, per_row_sampler=False,
                      bad_field=BadRequestField)
    assert error.value.field == "draft_confidence"
    frames = draft_options({"diffusion_frame": True, "stream": True}, per_row_sampler=False, bad_field=BadRequestField)
    assert frames == DraftOptions(drafts=True, confidence=False, frame=True)  # any draft field turns drafts on


def test_with_draft_adds_the_fields_asked_for():
    sse = 'data: {"id": "x", "choices": [{"index": 0, "delta": {}}]}'
    plain = json.loads(with_draft(sse, DraftText("ab", 1, 2, None, 6, False)).removeprefix("data: "))
    assert plain["draft"] == {"text": "ab", "canvas": 1, "step": 2, "provisional": True} and "type" not in plain
    detail = {"tokens": ["a", "b"], "confidence": [0.5, 1.0], "budget": 2, "max_steps": 6}
    framed = json.loads(with_draft(sse, DraftText("ab", 1, 2, detail, 6, True)).removeprefix("data: "))
    assert framed["draft"] == {"text": "ab", "canvas": 1, "step": 2, "provisional": True, **detail}
    assert {k: framed[k] for k in ("type", "block", "step", "total", "text")} == {
        "type": "diffusion_frame", "block": 1, "step": 2, "total": 6, "text": "ab"}
    assert framed["choices"] == [{"index": 0, "delta": {}}]  # still an ordinary (empty) chunk


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("drafts_ckpt"))
    served = build_app(ServeOptions(model=checkpoint, max_model_len=256, max_batch_size=2))
    server = BackgroundServer(served.app).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    yield served, client, checkpoint
    server.stop()
    served.state.shutdown()
    torch.set_num_threads(threads)


def stream(client, model, **extra):
    return list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "tell me"}],
                                               max_tokens=24, seed=3, stream=True, extra_body=extra))


def test_drafts_carry_each_positions_token_and_confidence(live):
    served, client, model = live
    chunks = stream(client, model, draft_confidence=True)
    drafts = [c.model_extra["draft"] for c in chunks if (c.model_extra or {}).get("draft")]
    # the same request alone through generate: its trace holds each step's argmax and entropy
    tokenizer = served.tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "tell me"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    trace = served.model.generate(ids, sampling="fast", seed=3, max_new_tokens=24, batching="lockstep",
                                  return_trace=True).trace
    records = [(int(c), int(s)) for c, s in zip(trace.tensors["canvas_index"], trace.tensors["step_index"])]
    assert [(d["canvas"], d["step"] - 1) for d in drafts] == records  # one draft per step, in order
    L = served.model.canvas_length
    for d, r in zip(drafts, range(len(records))):
        argmax, entropy = trace.tensors["argmax"][r, 0], trace.tensors["entropy"][r, 0]
        assert d["tokens"] == [tokenizer.decode([t], skip_special_tokens=False) for t in argmax.tolist()]
        assert len(d["confidence"]) == L and all(0 <= c <= 1 for c in d["confidence"])
        expected = (1 - entropy / math.log(V)).clamp(0, 1)
        assert torch.allclose(torch.tensor(d["confidence"]), expected, atol=2e-3), (d["confidence"], expected)
        assert d["budget"] == min(L, 24 - L * d["canvas"]) and d["max_steps"] == STEPS
    assert not any("type" in json.loads(c.model_dump_json()) for c in chunks)  # frames only when asked


def test_diffusion_frames_when_asked_and_nothing_extra_otherwise(live):
    served, client, model = live
    framed = [json.loads(c.model_dump_json()) for c in stream(client, model, diffusion_frame=True)]
    frames = [c for c in framed if c.get("type") == "diffusion_frame"]
    assert frames and all(f["block"] == f["draft"]["canvas"] and f["step"] == f["draft"]["step"] and f["total"] == STEPS
                          and f["text"] == f["draft"]["text"] for f in frames)
    assert all("confidence" not in f["draft"] for f in frames)  # confidence is its own field
    plain = [json.loads(c.model_dump_json()) for c in stream(client, model)]
    assert not any("draft" in c or "type" in c for c in plain)  # a plain OpenAI stream
    answer = lambda chunks: "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])  # noqa: E731
    assert answer(framed) == answer(plain)


def test_a_request_that_cannot_stream_confidence_is_refused(live):
    served, client, model = live
    with pytest.raises(openai.BadRequestError, match="draft_confidence"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=8,
                                       extra_body={"draft_confidence": True})  # no stream
    with pytest.raises(openai.BadRequestError, match="runs alone"):
        stream(client, model, draft_confidence=True, sampling="reference")
