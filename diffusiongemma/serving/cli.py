"""`diffusiongemma serve` (transformers' OpenAI-compatible server on our model) and `diffusiongemma chat` (a terminal
client that shows the denoising drafts live)."""

import json
import os
import sys

from ..cli_types import positive_int

SERVE_EXTRA = 'the serving dependencies are missing: pip install "diffusiongemma[serve]"'


def add_serve_commands(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a checkpoint with transformers' OpenAI-compatible server (docs/serving.md)",
        description="Start transformers serve's app (/v1/chat/completions, /v1/completions, /v1/models) on a "
        "DiffusionGemma checkpoint. Concurrent requests share the model through the mixed-phase scheduler; extra "
        "body fields set the diffusion settings per request and stream the denoising drafts.",
    )
    p.add_argument("--model", required=True, help="checkpoint folder or Hub id (bf16, FP8, NVFP4 or bitsandbytes)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or Hub id, if --model has none")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    p.add_argument("--device", default="auto", help="torch device; auto: cuda if available, else cpu")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's), bfloat16, float16 or float32")
    p.add_argument("--quantization", choices=["bnb-4bit", "bnb-8bit"], default=None,
                   help="quantize a bf16 checkpoint on load with bitsandbytes")
    p.add_argument("--max-batch-size", type=positive_int, default=8, help="rows sharing one forward (default 8)")
    p.add_argument("--max-queue", type=positive_int, default=64,
                   help="requests waiting for a row before the server answers 429 (default 64)")
    p.add_argument("--max-model-len", type=positive_int, default=4096,
                   help="most tokens per request, prompt + whole canvases (default 4096); sizes the KV cache")
    p.add_argument("--batch-invariant", action="store_true",
                   help="every request runs alone inside each pass, so a seeded request's tokens are bit-identical "
                   "to model.generate(prompt, seed=seed, batch_invariant=True) whatever else is served (slower; "
                   "docs/serving.md)")
    p.add_argument("--chat-template-kwargs", default=None, help="JSON object passed to apply_chat_template")
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.set_defaults(func=run_serve)

    c = subparsers.add_parser(
        "chat", help="chat with a running `diffusiongemma serve`, watching the drafts converge",
        description="A terminal client (the official `openai` package) for `diffusiongemma serve`. On a terminal each "
        "draft is redrawn in place below the committed text; otherwise drafts go to stderr as plain lines.",
    )
    c.add_argument("--url", default="http://127.0.0.1:8000", help="server address (default http://127.0.0.1:8000)")
    c.add_argument("--prompt", default=None, help="send one message and exit (default: read messages from stdin)")
    c.add_argument("--max-tokens", type=positive_int, default=256, help="max_tokens per reply (default 256)")
    c.add_argument("--seed", type=int, default=None, help="seed of every reply (default: random)")
    c.add_argument("--steps", type=positive_int, default=None, help="max_denoising_steps (default: the server's)")
    c.add_argument("--no-drafts", action="store_true", help="show committed text only")
    c.add_argument("--no-color", action="store_true", help="no ANSI codes even on a terminal (also: NO_COLOR=1)")
    c.set_defaults(func=run_chat)


def resolved_device(name: str) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def run_serve(args) -> int:
    try:
        import uvicorn

        from .app import ServeOptions, build_app
    except ImportError as error:
        print(f"error: {SERVE_EXTRA} ({error})", file=sys.stderr)
        return 2
    kwargs = json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else None
    if kwargs is not None and not isinstance(kwargs, dict):
        print("error: --chat-template-kwargs must be a JSON object", file=sys.stderr)
        return 2
    served = build_app(ServeOptions(
        model=args.model, tokenizer=args.tokenizer, device=resolved_device(args.device), dtype=args.dtype,
        quantization=args.quantization, max_batch_size=args.max_batch_size, max_queue=args.max_queue,
        max_model_len=args.max_model_len, chat_template_kwargs=kwargs, batch_invariant=args.batch_invariant,
    ))
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 (model id: {args.model})", file=sys.stderr)
    try:
        uvicorn.run(served.app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        served.state.shutdown()
    return 0


def run_chat(args) -> int:
    try:
        import openai
    except ImportError:
        print(f"error: {SERVE_EXTRA}", file=sys.stderr)
        return 2
    from .chat import DraftView, stream_reply

    client = openai.OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    ansi = not args.no_color and not os.environ.get("NO_COLOR") and sys.stdout.isatty()
    messages = []
    lines = [args.prompt] if args.prompt is not None else _typed_lines(sys.stdin)
    for line in lines:
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.strip()})
        view = DraftView(sys.stdout, sys.stderr, ansi=ansi, drafts=not args.no_drafts)
        reply = stream_reply(client, model, messages, view, max_tokens=args.max_tokens, seed=args.seed,
                             steps=args.steps)
        messages.append({"role": "assistant", "content": reply})
    return 0


def _typed_lines(stream):
    """Lines from `stream`, with a "> " prompt before each when it is a terminal."""
    interactive = stream.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = stream.readline()
        if not line:
            return
        yield line
