"""`logprobs` in `diffusiongemma serve` (serving/logprobs.py): the fixed-point rule, chat and completions, streamed and
not, in OpenAI's shapes; `echo` with logprobs refused with its reason; `compare --engine-url --logprobs` reads the
same values back from our server."""

import json

import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_checkpoint import write_checkpoint  # noqa: E402

from diffusiongemma.accuracy.engine_client import Answer  # noqa: E402
from diffusiongemma.accuracy.engine_compare import score_answer  # noqa: E402
from diffusiongemma.cli import main  # noqa: E402
from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402
from diffusiongemma.sudoku.demo import DEMO_MODEL  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi there"}]
PUZZLE = "<bos>" + ".725.3.4.3.68217..1..4.628..8.1..43...3...5..457.....252..3......86.4..19....8..5|"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = write_checkpoint(tmp_path_factory.mktemp("logprobs_ckpt"))
    running = []
    for path in (model, str(DEMO_MODEL)):
        served = build_app(ServeOptions(model=path, max_model_len=256, max_batch_size=4))
        running.append((served, BackgroundServer(served.app).start()))
    clients = [openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
               for _, server in running]
    yield {"tiny": (running[0][0], clients[0], model), "sudoku": (running[1][0], clients[1], str(DEMO_MODEL)),
           "sudoku_url": running[1][1].url + "/v1"}
    for served, server in running:
        server.stop()
        served.state.shutdown()
    torch.set_num_threads(threads)


def post(client, path, body):
    return client.post(path, body=body, cast_to=object)


def reference_logprobs(served, prompt_ids: list[int], ids: list[int], stopped: bool) -> list[float]:
    """compare's scoring of the answer (accuracy/engine_compare.py), which the served rule must equal."""
    return score_answer(served.model, prompt_ids, ids, stopped, Answer(0, 0, "", ids, None)).token_logprobs


def test_chat_logprobs_follow_the_rule_and_the_shape(live):
    served, client, model = live["tiny"]
    reply = post(client, "/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 24, "seed": 3,
                                               "logprobs": True, "top_logprobs": 3})
    choice = reply["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    for c in content:
        assert c["logprob"] <= 0 and bytes(c["bytes"]).decode() == c["token"]
        assert len(c["top_logprobs"]) == 3 and c["top_logprobs"][0]["logprob"] >= c["logprob"] - 1e-6
        assert [t["logprob"] for t in c["top_logprobs"]] == sorted((t["logprob"] for t in c["top_logprobs"]),
                                                                  reverse=True)
    ids = served.tokenizer.convert_tokens_to_ids([c["token"] for c in content])  # pieces of the vocabulary
    prompt = served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    expected = reference_logprobs(served, list(prompt), ids, choice["finish_reason"] == "stop")
    assert [c["logprob"] for c in content] == pytest.approx(expected[: len(content)], abs=1e-4)


def test_streamed_logprobs_equal_the_whole_response(live):
    _, client, model = live["tiny"]
    body = {"model": model, "messages": MESSAGES, "max_tokens": 24, "seed": 5, "logprobs": True, "top_logprobs": 1}
    whole = post(client, "/chat/completions", body)["choices"][0]
    streamed, text = [], ""
    for chunk in client.chat.completions.create(stream=True, **body):
        choice = chunk.choices[0] if chunk.choices else None
        if choice is not None and choice.logprobs is not None:
            streamed += [(c.token, c.logprob) for c in choice.logprobs.content]
        if choice is not None and choice.delta.content:
            text += choice.delta.content
    assert text == whole["message"]["content"]
    assert streamed == [(c["token"], pytest.approx(c["logprob"], abs=1e-5)) for c in whole["logprobs"]["content"]]


def test_completion_logprobs_streamed_and_not(live):
    served, client, model = live["sudoku"]
    body = {"model": model, "prompt": PUZZLE, "max_tokens": 82, "seed": 0, "logprobs": 2}
    choice = post(client, "/completions", body)["choices"][0]
    block = choice["logprobs"]
    assert "".join(block["tokens"]) == choice["text"] and len(block["tokens"]) == 81  # the EOS is not reported
    assert block["text_offset"] == list(range(81)) and all(len(t) == 2 for t in block["top_logprobs"])
    prompt = served.tokenizer(PUZZLE)["input_ids"]
    ids = served.tokenizer(choice["text"], add_special_tokens=False)["input_ids"]
    assert block["token_logprobs"] == pytest.approx(reference_logprobs(served, prompt, ids, True)[:81], abs=1e-4)
    tokens, values = [], []
    for chunk in client.completions.create(stream=True, **body):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
    assert tokens == block["tokens"] and values == pytest.approx(block["token_logprobs"], abs=1e-5)


def test_compare_reads_our_logprobs_back(live, tmp_path, capsys):
    _, _, model = live["sudoku"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PUZZLE + "\n")
    capsys.readouterr()
    code = main(["compare", "--model", model, "--engine-url", live["sudoku_url"], "--prompts", str(prompts),
                 "--samples", "2", "--max-tokens", "82", "--json", "--logprobs"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["tokens_from"] == "logprobs"
    reported = summary["reported_logprobs"]
    print(reported)
    # the same rule; compare loads the model in fp32, the server as stored (bf16 weights): rounding apart
    assert reported["tokens"] >= 2 * 81 and reported["mean_abs_difference"] < 1e-3
    assert reported["max_abs_difference"] < 0.02


@pytest.mark.parametrize("path, patch, param, words", [
    ("/completions", {"logprobs": 1, "echo": True}, "echo", "ELBO"),
    ("/completions", {"logprobs": 6}, "logprobs", "[0, 5]"),
    ("/chat/completions", {"top_logprobs": 2}, "top_logprobs", "logprobs: true"),
    ("/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    ("/chat/completions", {"logprobs": "yes"}, "logprobs", "true or false"),
])
def test_bad_logprobs_requests_are_400s_naming_the_field(live, path, patch, param, words):
    _, client, model = live["tiny"]
    body = {"model": model, "max_tokens": 8, **patch}
    body.update({"prompt": "abc"} if path == "/completions" else {"messages": MESSAGES})
    with pytest.raises(openai.BadRequestError) as error:
        post(client, path, body)
    assert error.value.body["param"] == param and words in error.value.body["message"]


def test_a_stop_string_cuts_the_logprobs_with_the_text(live):
    _, client, model = live["tiny"]
    body = {"model": model, "messages": MESSAGES, "max_tokens": 24, "seed": 3, "logprobs": True}
    whole = post(client, "/chat/completions", body)["choices"][0]
    tokens = [c["token"] for c in whole["logprobs"]["content"]]
    stop = tokens[len(tokens) // 2]  # a whole token: the answer ends right before it
    cut = post(client, "/chat/completions", {**body, "stop": [stop]})["choices"][0]
    content = cut["logprobs"]["content"]
    assert cut["message"]["content"] == "".join(tokens)[: "".join(tokens).find(stop)]
    assert "".join(c["token"] for c in content) == cut["message"]["content"]
    assert [c["logprob"] for c in content] == [c["logprob"] for c in whole["logprobs"]["content"][: len(content)]]
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **body, stop=[stop]):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += [c.token for c in chunk.choices[0].logprobs.content]
    assert streamed == [c["token"] for c in content]
