"""The README's playground picture: the bundled Sudoku demo model served, the playground page (`GET /playground`) in
headless Chromium solving one fresh puzzle through `/v1/completions`, captured mid-run and again at the end.

On CPU the demo model denoises a canvas in a fraction of a second, faster than a screenshot; so that the picture
shows a canvas still settling, this script slows every pass of the server by --delay seconds (a sleep before the
model's forward; the tokens are unchanged). The capture is taken when the page shows --step; `--done PATH` also
captures the page when the run has ended.

    python benchmarks/playground_screenshot.py [--out docs/images/playground.png] [--step 1] [--givens 36] [--done PATH]

Needs the system's Chromium and chromedriver (README, "Install") and selenium (the `test` extra).
"""

import argparse
import os
import shutil
import time

import torch

from diffusiongemma.serving.app import BackgroundServer, ServeOptions, build_app
from diffusiongemma.sudoku.demo import fresh_puzzles
from diffusiongemma.sudoku.tokenizer import encode_puzzle

DEMO_MODEL = os.path.join(os.path.dirname(__import__("diffusiongemma.sudoku", fromlist=["x"]).__file__), "demo_model")


def chromium(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never download a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def slowed(run_rows, delay: float):
    def run(*args, **kwargs):
        time.sleep(delay)
        return run_rows(*args, **kwargs)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/images/playground.png")
    parser.add_argument("--step", type=int, default=1, help="capture when the page shows this step")
    parser.add_argument("--done", help="also capture the page at the end of the run into this file")
    parser.add_argument("--givens", type=int, default=36)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.6, help="seconds of sleep before each server pass")
    parser.add_argument("--size", default="1100x900")
    args = parser.parse_args()
    torch.set_num_threads(1)
    served = build_app(ServeOptions(model=DEMO_MODEL, max_model_len=512))
    served.model.run_rows = slowed(served.model.run_rows, args.delay)
    server = BackgroundServer(served.app).start()
    driver = chromium(*map(int, args.size.split("x")))
    try:
        puzzle = fresh_puzzles(1, args.givens, seed=args.seed)[0]
        prompt = served.tokenizer.decode(encode_puzzle(served.tokenizer, puzzle))
        driver.get(server.url + "/playground")
        for element_id, value in (("prompt", prompt), ("max-tokens", 100), ("seed", args.seed), ("endpoint", "completion")):
            driver.execute_script("document.getElementById(arguments[0]).value = arguments[1]", element_id, str(value))
        driver.find_element("id", "run").click()
        deadline = time.monotonic() + 120
        while f"step {args.step} " not in driver.find_element("id", "step").text:
            if time.monotonic() > deadline or driver.find_element("tag name", "body").get_attribute("data-state") != "running":
                raise SystemExit(f"the run never showed step {args.step}: {driver.find_element('id', 'error').text}")
            time.sleep(0.02)
        driver.save_screenshot(args.out)
        while driver.find_element("tag name", "body").get_attribute("data-state") == "running":
            time.sleep(0.1)
        if args.done:
            driver.save_screenshot(args.done)
        print(f"wrote {args.out} at step {args.step}; the run ended at {driver.find_element('id', 'step').text!r}, "
              f"{driver.find_element('tag name', 'body').get_attribute('data-state')}: "
              f"{driver.find_element('id', 'output').text or driver.find_element('id', 'error').text}")
    finally:
        driver.quit()
        server.stop()
        served.state.shutdown()


if __name__ == "__main__":
    main()
