"""`diffusiongemma serve` (transformers' OpenAI-compatible server on our model) and `diffusiongemma chat` (a terminal
client that shows the denoising drafts live)."""

import json
import os
import signal
import sys
import threading

from ..cli_types import port_arg, positive_int, seed_arg, steps_arg

SERVE_EXTRA = 'the serving dependencies are missing: pip install "diffusiongemma[serve]"'
SHUTDOWN_GRACE_S = 5  # Ctrl-C: seconds a request in flight may still finish before it is cancelled


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
    p.add_argument("--port", type=port_arg, default=8000, help="listen port, 0-65535 (default 8000; 0: any free port)")
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
    p.add_argument("--compile", action="store_true",
                   help="run every denoising pass as a fixed-shape torch.compile graph per row bucket (1, 2, 4, ... up "
                   "to --max-batch-size) over a cache capacity fixed by --max-model-len; the first pass of each "
                   "bucket compiles (docs/serving.md)")
    p.add_argument("--compile-mode", choices=list(COMPILE_MODES), default=None,
                   help="torch.compile mode of --compile (implies it): default, reduce-overhead (CUDA graphs) or "
                   "max-autotune-no-cudagraphs")
    p.add_argument("--decoder-window", choices=["reference", "symmetric"], default="reference",
                   help="sliding-layer semantics of the denoising passes: reference (default), or symmetric, the "
                   "|q - k| <= W-1 window of flash-attention engines, a semantics switch for checking "
                   "`compare --engine-url` (docs/reference-accuracy.md); GET /v1/models names it")
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
    c.add_argument("--seed", type=seed_arg, default=None, help="seed of every reply (default: random)")
    c.add_argument("--steps", type=steps_arg, default=None, help="max_denoising_steps (default: the server's)")
    c.add_argument("--no-drafts", action="store_true", help="show committed text only")
    c.add_argument("--no-color", action="store_true", help="no ANSI codes even on a terminal (also: NO_COLOR=1)")
    c.add_argument("--tools", default=None, metavar="FILE",
                   help="JSON file with a list of OpenAI tools the model may call; each call is shown and the next "
                   "typed line is sent back as its result (role \"tool\")")
    c.add_argument("--tool-choice", default=None, help="auto (default with --tools), required, none, or a tool name")
    c.set_defaults(func=run_chat)


def resolved_device(name: str) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def check_serve_sources(model: str, tokenizer: str | None) -> None:
    """Before loading: a local --model folder must exist and be a DiffusionGemma checkpoint, and some tokenizer must
    exist (a model folder without tokenizer files would get transformers' default tokenizer for the model type, whose
    ids mean nothing to this checkpoint).

    Raises:
        FileNotFoundError / ValueError: naming the option and the path.
    """
    from ..io.tokenizer_files import TOKENIZER_FILES, folder_has_tokenizer
    from ..modeling.config import check_model_folder, looks_local

    try:
        check_model_folder(model)
    except (FileNotFoundError, ValueError) as error:
        raise type(error)(f"--model {model}: {error}") from None
    if tokenizer is None:
        if os.path.isdir(model) and not folder_has_tokenizer(model):
            raise FileNotFoundError(f"--model {model} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
                                    "pass --tokenizer FOLDER_OR_HUB_ID")
    elif os.path.isdir(tokenizer):
        if not folder_has_tokenizer(tokenizer):
            raise FileNotFoundError(f"--tokenizer {tokenizer} holds none of {', '.join(TOKENIZER_FILES)}")
    elif os.path.exists(tokenizer) or looks_local(tokenizer):
        raise FileNotFoundError(f"--tokenizer {tokenizer}: no such folder")


def stopping_server_class():
    import uvicorn

    class StoppingServer(uvicorn.Server):
        """uvicorn's server that, on the first Ctrl-C (or SIGTERM), also stops the scheduler: requests in flight end
        at the next step boundary with an error event ("the server is shutting down") instead of holding uvicorn's
        graceful shutdown until they finish."""

        def __init__(self, served, config):
            super().__init__(config)
            self.served = served
            self.interrupted = False  # a Ctrl-C came: exit 130 even when uvicorn does not re-raise it

        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGINT:
                self.interrupted = True
            if not self.should_exit:  # the signal handler runs on the event loop: join the scheduler elsewhere
                threading.Thread(target=self.served.state.shutdown, name="diffusiongemma-stop", daemon=True).start()
            super().handle_exit(sig, frame)

    return StoppingServer


COMPILE_MODES = {"default": None, "reduce-overhead": "reduce-overhead",
                 "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}


def serve_compile(flag: bool, mode: str | None) -> bool | dict:
    """--compile / --compile-mode -> the scheduler's `compile` (False, or the torch.compile options)."""
    if mode is None:
        return bool(flag)
    return {"mode": COMPILE_MODES[mode]} if COMPILE_MODES[mode] else True


def run_serve(args) -> int:
    try:
        import uvicorn

        from .app import ServeOptions, build_app
    except ImportError as error:
        print(f"error: {SERVE_EXTRA} ({error})", file=sys.stderr)
        return 2
    StoppingServer = stopping_server_class()
    try:
        kwargs = json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else None
    except ValueError as error:
        print(f"error: --chat-template-kwargs is not valid JSON ({error})", file=sys.stderr)
        return 2
    if kwargs is not None and not isinstance(kwargs, dict):
        print("error: --chat-template-kwargs must be a JSON object", file=sys.stderr)
        return 2
    compile = serve_compile(args.compile, args.compile_mode)
    if compile and args.batch_invariant:
        print("error: --compile cannot run with --batch-invariant: every request runs alone at the shapes of its solo "
              "run, which a pass fixed per row bucket would change", file=sys.stderr)
        return 2
    try:
        check_serve_sources(args.model, args.tokenizer)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    served = build_app(ServeOptions(
        model=args.model, tokenizer=args.tokenizer, device=resolved_device(args.device), dtype=args.dtype,
        quantization=args.quantization, max_batch_size=args.max_batch_size, max_queue=args.max_queue,
        max_model_len=args.max_model_len, chat_template_kwargs=kwargs, batch_invariant=args.batch_invariant,
        decoder_window=args.decoder_window, compile=compile,
    ))
    server = StoppingServer(served, uvicorn.Config(served.app, host=args.host, port=args.port,
                                                   log_level=args.log_level,
                                                   timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 (model id: {args.model}); Ctrl-C stops it",
          file=sys.stderr)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled once it has shut down
        print("stopped (interrupted)", file=sys.stderr)
        return 130
    finally:
        served.state.shutdown()
    if server.interrupted:  # uvicorn re-raises a handled Ctrl-C only when asyncio's own SIGINT handler lets it
        print("stopped (interrupted)", file=sys.stderr)
        return 130
    if not server.started:
        return 1  # uvicorn logged why (the port is taken, ...)
    return 0


def run_chat(args) -> int:
    if args.prompt is not None and not args.prompt.strip():
        print("error: --prompt is empty: give the message to send, or leave --prompt out to type messages",
              file=sys.stderr)
        return 2
    try:
        import openai
    except ImportError:
        print(f"error: {SERVE_EXTRA}", file=sys.stderr)
        return 2
    from .chat import DraftView, stream_turn

    try:
        tools, tool_choice = chat_tools(args.tools, args.tool_choice)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    url = args.url.rstrip("/")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    try:
        model = client.models.list().data[0].id
        ansi = not args.no_color and not os.environ.get("NO_COLOR") and sys.stdout.isatty()
        messages = []
        lines = [args.prompt] if args.prompt is not None else _typed_lines(sys.stdin)
        waiting = []  # tool calls whose results the next typed lines are
        for line in lines:
            if not line.strip():
                continue
            if waiting:
                messages.append({"role": "tool", "tool_call_id": waiting.pop(0)["id"], "content": line.strip()})
                if waiting:
                    print(f"[result of {waiting[0]['function']['name']}]", file=sys.stderr)
                    continue
            else:
                messages.append({"role": "user", "content": line.strip()})
            view = DraftView(sys.stdout, sys.stderr, ansi=ansi, drafts=not args.no_drafts)
            reply, calls = stream_turn(client, model, messages, view, max_tokens=args.max_tokens, seed=args.seed,
                                       steps=args.steps, tools=tools, tool_choice=tool_choice)
            messages.append({"role": "assistant", "content": reply or None, **({"tool_calls": calls} if calls else {})})
            waiting = list(calls)
            if waiting and args.prompt is None:
                print(f"[result of {waiting[0]['function']['name']}]", file=sys.stderr)
    except openai.APIConnectionError as error:
        print(f"error: cannot reach the server at {url} ({error.__cause__ or error}); is `diffusiongemma serve` "
              "running there?", file=sys.stderr)
        return 1
    except openai.APIStatusError as error:
        print(f"error: the server at {url} answered {error.status_code}: {server_message(error)}", file=sys.stderr)
        return 1
    except openai.APIError as error:  # e.g. an error event inside a stream
        print(f"error: the server at {url} reported: {error.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    return 0


def chat_tools(path: str | None, choice: str | None) -> tuple[list | None, object]:
    """(the tools of --tools FILE, checked; the tool_choice of --tool-choice) or a ValueError naming the flag."""
    if path is None:
        if choice is not None:
            raise ValueError("--tool-choice needs --tools FILE")
        return None, None
    from ..constraints import ConstraintError
    from ..constraints.tools import check_tools

    try:
        with open(path) as f:
            tools = json.load(f)
    except OSError as error:
        raise ValueError(f"--tools {path}: cannot read it ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"--tools {path}: not valid JSON ({error})") from None
    try:
        names = [f["name"] for f in check_tools(tools)]
    except ConstraintError as error:
        raise ValueError(f"--tools {path}: {error}") from None
    if choice is None or choice in ("auto", "required", "none"):
        return tools, choice
    if choice not in names:
        raise ValueError(f"--tool-choice {choice!r} names no tool of {path} (tools: {names}; or auto, required, none)")
    return tools, {"type": "function", "function": {"name": choice}}


def server_message(error) -> str:
    """The server's own message of an `openai.APIStatusError` (OpenAI format, or transformers serve's `detail`)."""
    body = error.body if isinstance(error.body, dict) else {}
    inner = body.get("error") if isinstance(body.get("error"), dict) else body
    return str(inner.get("message") or body.get("detail") or error.message)


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
