"""The playground page (serving/playground.py, playground.html) in headless Chromium against a live server on a tiny
model: the page loads without console errors, a run draws every denoising step (distinct `#step` texts, one `.cell`
per canvas position with a `data-confidence` in [0, 1]), `#output` equals the chat completion API's answer for the
same seed and settings, Stop cancels the request on the server, and bad requests (max tokens 0, a malformed regex,
a full queue: 429) show the server's message in `#error`.

The server runs in this process (`BackgroundServer`: the app `diffusiongemma serve` runs, on a real socket). The
model's logits are not sharpened and its `confidence_threshold` is tiny, so every canvas runs all its steps.
"""

import json
import re
import time
import urllib.request

import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai, fastapi, uvicorn) is not installed")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from browser import console_errors, headless_chromium  # noqa: E402
from conftest import tiny_model, tiny_tokenizer, write_generation_config  # noqa: E402

from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app  # noqa: E402

STEPS, L = 4, 16
WAIT = 30  # seconds any one wait of the page may take at most

# The page's #step texts and every cell's data-confidence, recorded in the page as they change (a poll from the
# test could miss a step); read back with `window.seen`.
RECORD = """
window.seen = {steps: [], confidences: [], cells: []};
new MutationObserver(() => {
  const step = document.getElementById('step').textContent;
  if (step && window.seen.steps[window.seen.steps.length - 1] !== step) window.seen.steps.push(step);
  const cells = document.querySelectorAll('#canvas .cell');
  if (cells.length) window.seen.cells.push(cells.length);
  cells.forEach((c) => window.seen.confidences.push(c.dataset.confidence));
}).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = tmp_path_factory.mktemp("playground_ckpt")
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    write_generation_config(path, eos_token_id=1, pad_token_id=0, max_new_tokens=32, max_denoising_steps=STEPS,
                            stability_threshold=0, confidence_threshold=1e-6)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    served = build_app(ServeOptions(model=str(path), max_model_len=256, max_batch_size=2, max_queue=4))
    server = BackgroundServer(served.app).start()
    driver = headless_chromium()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)
    yield served, server, driver, client, str(path)
    driver.quit()
    server.stop()
    served.state.shutdown()
    torch.set_num_threads(threads)


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT} s for {what}")
        time.sleep(0.02)


def fill(driver, **fields):
    """Set the page's inputs by id (`max_tokens=` sets #max-tokens)."""
    for name, value in fields.items():
        element = driver.find_element("id", name.replace("_", "-"))
        driver.execute_script("arguments[0].value = arguments[1]", element, str(value))


def run_page(driver, **fields) -> str:
    """Fill the inputs, click Run, wait for the run to end; the page's final state (done / error / stopped)."""
    fill(driver, **fields)
    driver.execute_script(RECORD)
    driver.find_element("id", "run").click()
    state = lambda: driver.find_element("tag name", "body").get_attribute("data-state") or ""  # noqa: E731
    wait_for(lambda: state() not in ("", "running"), "the run to end")
    return state()


def text(driver, element_id: str) -> str:
    return driver.execute_script(f"return document.getElementById('{element_id}').textContent")


def test_root_links_the_page_and_the_page_loads_without_console_errors(live):
    served, server, driver, _, model = live
    root = urllib.request.urlopen(server.url + "/", timeout=10).read().decode()
    assert 'href="/playground"' in root and model in root
    driver.get(server.url + "/playground")
    for selector in ("textarea#prompt", "button#run", "button#stop", "input#seed", "input#max-tokens", "select#sampler",
                     "input#regex", "textarea#schema", "#canvas", "#step", "#output", "#error", "#committed"):
        assert driver.find_elements("css selector", selector), selector
    presets = [o.get_attribute("value") for o in driver.find_elements("css selector", "#sampler option")]
    assert presets[0] == "" and "block-refinement" in presets  # checkpoint default, then the presets
    assert not driver.find_elements("css selector", "script[src], link[rel=stylesheet]")  # no CDN: all inline
    assert console_errors(driver) == []


def test_a_run_draws_every_step_and_answers_as_the_api(live):
    served, server, driver, client, model = live
    driver.get(server.url + "/playground")
    state = run_page(driver, prompt="hello there", seed=7, max_tokens=32)
    assert state.startswith("done"), text(driver, "error")
    seen = driver.execute_script("return window.seen")
    steps = seen["steps"]
    assert len(set(steps)) >= 2 and f"step {STEPS} of at most {STEPS}" in steps[-1], steps
    assert set(seen["cells"]) == {L}  # one cell per canvas position
    confidences = [float(c) for c in seen["confidences"]]
    assert confidences and all(0 <= c <= 1 for c in confidences)
    assert len(set(confidences)) > 1  # positions differ: real per-position values, not one placeholder
    canvases = int(steps[-1].split()[1])
    assert len(driver.find_elements("css selector", "#committed .cell")) == canvases * L  # every canvas kept
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello there"}],
                                           max_tokens=32, seed=7)
    assert text(driver, "output") == reply.choices[0].message.content
    assert text(driver, "error") == ""
    assert console_errors(driver) == []


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


@pytest.mark.parametrize("fields, extra", [
    (dict(regex="[ab]{2,6}"), {"regex": "[ab]{2,6}"}),
    (dict(schema=json.dumps(SCHEMA)), {"response_format": {"type": "json_schema",
                                                           "json_schema": {"name": "playground", "schema": SCHEMA}}}),
    (dict(sampler="block-refinement"), {"sampler_preset": "block-refinement"}),
])
def test_constrained_and_preset_runs_answer_as_the_api(live, fields, extra):
    served, server, driver, client, model = live
    driver.get(server.url + "/playground")
    state = run_page(driver, prompt="go", seed=3, max_tokens=16, **fields)
    assert state.startswith("done"), text(driver, "error")
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "go"}], max_tokens=16,
                                           seed=3, extra_body=extra)
    assert text(driver, "output") == reply.choices[0].message.content
    if "regex" in extra:
        assert re.fullmatch(extra["regex"], text(driver, "output"))


def test_stop_cancels_the_request_on_the_server(live):
    served, server, driver, _, _ = live
    driver.get(server.url + "/playground")
    fill(driver, prompt="a long one", seed=1, max_tokens=64, steps=1000)
    driver.find_element("id", "run").click()
    wait_for(lambda: text(driver, "step"), "the first step")
    driver.find_element("id", "stop").click()
    wait_for(lambda: driver.find_element("tag name", "body").get_attribute("data-state") == "stopped", "Stop")
    wait_for(lambda: served.scheduler.active_rows == 0 and served.scheduler.waiting == 0, "the row to leave")
    assert text(driver, "error") == ""


@pytest.mark.parametrize("fields, message", [
    (dict(max_tokens=0), "400: `max_tokens`"),
    (dict(max_tokens=8, regex="(ab"), "400: `regex`"),
    (dict(max_tokens=8, schema="{not json"), "schema: not valid JSON"),
])
def test_a_bad_request_shows_the_servers_message(live, fields, message):
    served, server, driver, _, _ = live
    driver.get(server.url + "/playground")
    assert run_page(driver, **fields) == "error"
    assert text(driver, "error").startswith(message), text(driver, "error")


def test_a_busy_server_shows_429(live):
    served, server, driver, client, model = live
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=4)
    scheduler = served.scheduler
    scheduler.max_queue = 0  # every new request finds the queue full
    try:
        driver.get(server.url + "/playground")
        assert run_page(driver, max_tokens=8) == "error"
    finally:
        scheduler.max_queue = 4
    assert text(driver, "error").startswith("429: server busy"), text(driver, "error")
