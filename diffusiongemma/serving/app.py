"""Assemble transformers serve's FastAPI app around our model manager, generation state and handlers, and run it.

`transformers serve` builds its app in `Serve.__init__`, with its own classes fixed inside; the app itself comes from
the public factory `transformers.cli.serving.server.build_server`, which takes the manager and handlers as arguments.
We call that factory with ours. Routes block diffusion does not serve (`/v1/responses`, `/v1/systemone`,
`/v1/audio/transcriptions`) answer 501. Two pages of ours join them: `GET /` and the live `GET /playground`
(playground.py).
"""

import asyncio
import socket
import threading
from dataclasses import dataclass

from .engine import DiffusionGenerationState, DiffusionModelManager


@dataclass
class ServeOptions:
    """`diffusiongemma serve`'s settings (see its --help)."""

    model: str
    tokenizer: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    quantization: str | None = None  # "bnb-4bit" / "bnb-8bit" (transformers serve's names)
    max_batch_size: int = 8
    max_queue: int = 64
    max_model_len: int = 4096
    chat_template_kwargs: dict | None = None
    batch_invariant: bool = False  # every row alone in each pass (generation/invariant.py)
    compile: bool | dict = False  # compiled denoising passes (`generate`'s `compile`: True or {mode, backend})
    decoder_window: str = "reference"  # "symmetric": the semantics switch (docs/reference-accuracy.md)


@dataclass
class ServedApp:
    app: object  # the FastAPI app
    state: DiffusionGenerationState  # `state.shutdown()` stops the scheduler
    models: DiffusionModelManager

    @property
    def model(self):
        return next(iter(self.models.loaded_models.values())).model

    @property
    def tokenizer(self):
        return next(iter(self.models.loaded_models.values())).processor

    @property
    def scheduler(self):
        """The running `ServingScheduler` (None before the first request)."""
        managers = list(self.state._generate_managers.values())
        return managers[0].scheduler if managers else None


def build_app(options: ServeOptions) -> ServedApp:
    """Load the model and build transformers serve's app around it."""
    from transformers.cli.serving.server import build_server

    from .handlers import DiffusionChatHandler, DiffusionCompletionHandler, NotServed, add_error_handlers
    from .playground import add_pages

    manager = DiffusionModelManager(device=options.device, dtype=options.dtype, quantization=options.quantization,
                                    force_model=options.model, tokenizer=options.tokenizer,
                                    decoder_window=options.decoder_window)
    state = DiffusionGenerationState(max_batch_size=options.max_batch_size, max_queue=options.max_queue,
                                     max_model_len=options.max_model_len, batch_invariant=options.batch_invariant,
                                     compile=options.compile)
    chat = DiffusionChatHandler(manager, state, chat_template_kwargs=options.chat_template_kwargs or {})
    completion = DiffusionCompletionHandler(manager, state)
    app = build_server(manager, chat, completion_handler=completion, response_handler=NotServed("/v1/responses"),
                       transcription_handler=NotServed("/v1/audio/transcriptions"),
                       systemone_handler=NotServed("/v1/systemone"), generation_state=state)
    add_error_handlers(app)
    add_pages(app, options.model)
    return ServedApp(app, state, manager)


class BackgroundServer:
    """uvicorn serving `app` on a thread, on a socket bound before the start (port 0: a free port, no race).

    Used by the tests and the load benchmark; `diffusiongemma serve` runs uvicorn in the foreground.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = self.socket.getsockname()
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.socket])),
                                        name="diffusiongemma-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self._thread.start()
        for _ in range(int(timeout * 100)):
            if self.server.started:
                return self
            if not self._thread.is_alive():
                break
            threading.Event().wait(0.01)
        raise RuntimeError(f"the server did not start within {timeout} s")

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self.socket.close()
