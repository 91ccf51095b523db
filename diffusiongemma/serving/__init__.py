"""Serving DiffusionGemma with transformers' own OpenAI-compatible server (docs/serving.md).

    settings.py   one request's settings from the body, validated (400 naming the field)
    streamer.py   transformers serve's DirectStreamer taught drafts, canvases, max_tokens and stop strings
    scheduler.py  the mixed-phase pool that rows join and leave at step boundaries (one model thread)
    engine.py     transformers serve's ModelManager / GenerationState seams, filled with our class and scheduler
    handlers.py   transformers serve's chat and completion handlers with the extra fields and the draft chunks
    app.py        the app from transformers' `build_server`, and a background server for tests and benchmarks
    cli.py        `diffusiongemma serve` and `diffusiongemma chat`

Needs the `serve` extra (fastapi, uvicorn, openai, pydantic): `pip install "diffusiongemma[serve]"`.
"""
