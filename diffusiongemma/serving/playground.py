"""The server's two pages: `GET /` (what this server is, with links) and `GET /playground`, a page that sends a chat
request with `draft_confidence` and draws each denoising step of the canvas as it streams (playground.html; no
CDN, nothing computed in the page). The model id and the sampler presets are filled in here."""

import html
from importlib import resources

from ..generation.sampler_presets import SAMPLER_PRESETS

INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>diffusiongemma serve</title></head>
<body style="font: 14px/1.5 system-ui, sans-serif; margin: 2em">
<h1 style="font-size: 1.3em">diffusiongemma serve</h1>
<p>Model <code>{model}</code>: an OpenAI-compatible block-diffusion server.</p>
<ul>
<li><a href="/playground">Playground</a>: watch the canvas denoise, step by step</li>
<li><code>POST /v1/chat/completions</code>, <code>POST /v1/completions</code> (streaming or not; docs/serving.md)</li>
<li><a href="/v1/models">/v1/models</a> · <a href="/health">/health</a></li>
</ul></body></html>
"""


def playground_page(model: str) -> str:
    """playground.html with the model id and one `<option>` per sampler preset."""
    page = resources.files(__package__).joinpath("playground.html").read_text(encoding="utf-8")
    options = "".join(f'<option value="{html.escape(name)}">preset: {html.escape(name)}</option>'
                      for name in SAMPLER_PRESETS)
    return (page.replace("__MODEL_TEXT__", html.escape(model)).replace("__MODEL__", html.escape(model, quote=True))
            .replace("__PRESET_OPTIONS__", options))


def add_pages(app, model: str) -> None:
    """Serve `GET /` and `GET /playground` on `app` (the FastAPI app of `build_app`)."""
    from fastapi.responses import HTMLResponse

    index, playground = INDEX.format(model=html.escape(model)), playground_page(model)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def root():
        return index

    @app.get("/playground", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return playground
