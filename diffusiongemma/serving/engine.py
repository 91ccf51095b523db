"""What transformers serve needs to host a block-diffusion model, through the classes it hands its handlers.

transformers serve's handlers receive a `ModelManager` (loads the model and processor) and a `GenerationState`
(gives each model a generation manager with `generate_streaming` / `generate_non_streaming`). We subclass those two
public seams and leave the app, the routes, the chat templates and the SSE framing to transformers:

    DiffusionModelManager     loads `diffusiongemma.DiffusionGemmaForBlockDiffusion` (bf16, compressed-tensors FP8 /
                              NVFP4, bitsandbytes folders: whatever our `from_pretrained` loads) instead of
                              `getattr(transformers, config.architectures[0])`, which is the built-in class
    DiffusionGenerationState  hands out one `DiffusionGenerateManager` per model (never continuous batching)
    DiffusionGenerateManager  submits requests to our `ServingScheduler` instead of one `model.generate` at a time
"""

import asyncio

from transformers import AutoTokenizer
from transformers.cli.serving.model_manager import ModelManager
from transformers.cli.serving.utils import BaseGenerateManager, GenerationState, Modality, _StreamError

from .constraint_fields import compiled_constraint
from .scheduler import Job, ServingScheduler
from .settings import RequestSettings, check_length
from .streamer import AnswerFailed, ConstrainedAnswerError, DraftText, RowStreamer


class DiffusionModelManager(ModelManager):
    """transformers serve's model manager loading our class (text-only: the tokenizer is the processor).

    Args (besides `ModelManager`'s):
        tokenizer: a tokenizer folder or Hub id for checkpoints that ship none.
        decoder_window: the denoising passes' sliding-layer semantics ("reference", or the "symmetric" switch that
            names an engine difference, docs/reference-accuracy.md); `GET /v1/models` says which is served.
    """

    def __init__(self, *args, tokenizer: str | None = None, decoder_window: str = "reference", **kwargs):
        from ..modeling.masks import DECODER_WINDOWS

        if decoder_window not in DECODER_WINDOWS:
            raise ValueError(f"decoder_window must be one of {DECODER_WINDOWS}, got {decoder_window!r}")
        self.tokenizer_path = tokenizer
        self.decoder_window = decoder_window
        super().__init__(*args, **kwargs)

    def _load_processor(self, model_id_and_revision: str, gguf_file: str | None = None):
        model_id, revision = model_id_and_revision.split("@", 1)
        kwargs = {"revision": revision} if revision != "main" else {}
        return AutoTokenizer.from_pretrained(self.tokenizer_path or model_id, **kwargs)

    def _load_model(self, model_id_and_revision: str, tqdm_class=None, progress_callback=None, gguf_file=None):
        from ..model import DiffusionGemmaForBlockDiffusion

        if gguf_file is not None:
            raise ValueError(f"{gguf_file}: GGUF files are not DiffusionGemma checkpoints")
        model_id, revision = model_id_and_revision.split("@", 1)
        kwargs = {"dtype": self.dtype}
        if revision != "main":
            kwargs["revision"] = revision
        quantization_config = self.get_quantization_config()
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_id, **kwargs)
        if quantization_config is None:
            model = model.to(self.device)
        model.get_decoder().decoder_window = self.decoder_window
        return model.eval()

    @staticmethod
    def get_model_modality(model, processor=None) -> Modality:
        return Modality.LLM  # the scheduler takes text; image parts of a message are dropped by the handlers

    def get_gen_models(self, cache_dir: str | None = None) -> list[dict]:
        """The models this server answers for (transformers lists the Hub cache; this server serves --model), each
        with the semantics switch it runs under (`decoder_window`), which `compare --engine-url` reports."""
        return [{"id": key.removesuffix("@main"), "object": "model", "owned_by": "diffusiongemma", "created": 0,
                 "decoder_window": self.decoder_window} for key in self.loaded_models]


class DiffusionGenerateManager(BaseGenerateManager):
    """Generation for one model: every request becomes a row of the shared `ServingScheduler`.

    Args: scheduler_options: `ServingScheduler` keyword arguments (max_batch_size, max_queue, max_model_len,
    batch_invariant, compile).
    """

    def __init__(self, **scheduler_options):
        self.options = scheduler_options
        self.scheduler: ServingScheduler | None = None

    def _submit(self, model, processor, inputs, settings: RequestSettings, response_parser=None):
        if not isinstance(settings, RequestSettings):
            raise TypeError("DiffusionGenerateManager takes the RequestSettings the diffusion handlers build")
        if self.scheduler is None:
            self.scheduler = ServingScheduler(model, **self.options)
        prompt = inputs["input_ids"][0]  # [P]
        check_length(settings, len(prompt), model.canvas_length, self.scheduler.max_model_len,  # else 400
                     self.scheduler.requested_max_model_len)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        tokenizer = getattr(processor, "tokenizer", processor)
        if settings.tools is not None:  # calls are read from the text with its special tokens (serving/tools.py)
            settings.tools.bind(tokenizer, settings)  # else 400: the template does not render tools
            response_parser = settings.tools
        settings.automaton = compiled_constraint(settings, tokenizer, self.scheduler.V)  # else 400
        settings.tokenizer = tokenizer
        streamer = RowStreamer(tokenizer, loop, queue, settings, response_parser=response_parser)
        if settings.logprobs is not None:  # one decoder pass per committed canvas (serving/logprobs.py)
            from .logprobs import CanvasScorer

            streamer.scorer = CanvasScorer(model, settings.logprobs)
        self.scheduler.submit(Job(prompt, settings, streamer))  # QueueFull: 429 (handlers.add_error_handlers)
        return queue, streamer

    def generate_streaming(self, model, processor, inputs, gen_config, request_id, response_parser=None):
        return self._submit(model, processor, inputs, gen_config, response_parser)

    async def generate_non_streaming(self, model, processor, inputs, gen_config, request_id):
        """Run to the end and return (text, prompt length, generated ids); cancelled if the caller is."""
        queue, streamer = self._submit(model, processor, inputs, gen_config)
        pieces = []
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, AnswerFailed):
                    raise ConstrainedAnswerError(item.message)
                if isinstance(item, _StreamError):
                    raise RuntimeError(item.msg)
                if isinstance(item, str) and not isinstance(item, DraftText):  # content (tool calls: tools.py)
                    pieces.append(item)
        except asyncio.CancelledError:  # the client went away: free the row
            streamer.cancel()
            raise
        return "".join(pieces), inputs["input_ids"].shape[-1], streamer.generated

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown()
            self.scheduler = None


class DiffusionGenerationState(GenerationState):
    """transformers serve's generation state handing out `DiffusionGenerateManager`s."""

    def __init__(self, **scheduler_options):
        super().__init__(continuous_batching=False)
        self.options = scheduler_options

    def use_continuous_batching(self, model, modality) -> bool:
        return False  # the mixed-phase scheduler is our continuous batching

    def get_manager(self, model_id: str, use_cb: bool = False) -> DiffusionGenerateManager:
        if model_id not in self._generate_managers:
            self._generate_managers[model_id] = DiffusionGenerateManager(**self.options)
        return self._generate_managers[model_id]

    def shutdown(self) -> None:
        for manager in self._generate_managers.values():
            manager.stop()
        super().shutdown()
