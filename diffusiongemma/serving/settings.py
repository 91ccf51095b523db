"""One request's generation settings, read from an OpenAI request body and validated (a bad value names its field).

Standard fields: `max_tokens` (chat also `max_completion_tokens`), `stop`, `seed`. Extra body fields (the `openai`
client sends them with `extra_body=`): the diffusion settings `max_denoising_steps`, `entropy_bound`, `t_min`, `t_max`,
`stability_threshold`, `confidence_threshold`, `sampling`, and the draft fields (`stream_drafts`, `draft_confidence`,
`diffusion_frame`: drafts.py); `sampler` and its settings (`sampler_settings`, sampler_request.py);
`stopper` and `stopper_settings` for a plug-in
stopper (stopper_request.py). `temperature` and `top_p` are accepted
and reported unused once (block diffusion follows its own temperature schedule), as `generate` does.

Every range check is the generation config's (`generation_config.validate_field`), applied one field at a time so
the error names the field the client sent; `t_max > t_min` is checked once both are known, citing which value was
sent and which is this server's default. The server adds one bound of its own: `max_denoising_steps` at most
`MAX_REQUEST_STEPS`, since a request holds its row (and, with a global-RNG sampler, the whole model) for up to that
many passes per canvas. Fields this server cannot honour are refused in `request_checks.py`.
"""

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

from transformers.utils import logging

from ..generation.config import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig, resolve_generation_config
from ..generation_config import validate_field
from ..generation.resolve import SEED_MAX
from ..generation.sampler import sampler_class_for, sampling_names
from ..sampler_configs import check_sampler_config
from .drafts import DraftOptions, draft_options
from .sampler_request import request_sampler_config
from .stopper_request import request_stopper_config

logger = logging.get_logger(__name__)

# extra body fields -> how they land on the generation config
CONFIG_FIELDS = ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold")
FLOAT_FIELDS = ("t_min", "t_max", "confidence_threshold", "entropy_bound")  # a JSON int (1) is a float here
UNUSED_AR_FIELDS = ("temperature", "top_p")
MAX_STOP_STRINGS = 4  # as the OpenAI API
MAX_REQUEST_STEPS = 1024  # max_denoising_steps per request (docs/serving.md); the released config takes 48


class BadRequestField(ValueError):
    """A request field holds a bad value. `field` names it; the server answers 400 with the message."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"`{field_name}`: {message}")


@dataclass
class RequestSettings:
    """What one request asks for (passed where transformers serve passes a `GenerationConfig`).

    `max_new_tokens` is the OpenAI `max_tokens`: the response holds at most that many tokens, generated as
    ceil(max_new_tokens / L) whole canvases.
    """

    config: DiffusionGemmaGenerationConfig  # resolved and validated, max_new_tokens included
    max_new_tokens: int
    seed: int | None = None
    sampling: str = "fast"
    stop: list[str] = field(default_factory=list)
    stream_drafts: bool = False  # stream draft chunks (any of the draft fields asked for them)
    draft: DraftOptions = field(default_factory=DraftOptions)  # what the draft chunks carry (drafts.py)
    length_field: str = "max_tokens"  # the body field that set max_new_tokens (named by a length error)
    prompt_field: str = "messages"  # the body field holding the prompt ("messages" or "prompt")
    constraint: object = None  # `Regex` / `JsonSchema` from `response_format` or `regex` (constraint_fields.py)
    constraint_field: str | None = None  # the body field it came from
    automaton: object = None  # the constraint compiled over the server's tokenizer
    tokenizer: object = None  # that tokenizer
    logprobs: int | None = None  # top alternatives per token when the request asks for logprobs (serving/logprobs.py)
    logprob_entries: list = field(default_factory=list)  # the answer's `TokenLogprob`s, filled by its streamer
    tools: object = None  # the `ToolCallReader` of a request with `tools` (serving/tools.py)

    @property
    def eos_token_id(self):
        return self.config.eos_token_id


def _number(name: str, value, want_int: bool):
    if isinstance(value, bool) or not isinstance(value, Real):
        raise BadRequestField(name, f"must be a number, got {value!r}")
    if want_int:
        if not isinstance(value, Integral):
            raise BadRequestField(name, f"must be an integer, got {value!r}")
        return int(value)
    value = float(value)
    if not math.isfinite(value):
        raise BadRequestField(name, f"must be finite, got {value!r}")
    return value


def _checked(name: str, attr: str, value) -> None:
    """Check one field's type and range on its own, so a failure names `name` (the body field)."""
    try:
        validate_field(attr, value)
    except ValueError as error:
        raise BadRequestField(name, str(error)) from None


def stop_strings(value) -> list[str]:
    """`stop`: None, a string or a list of at most 4 non-empty strings."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequestField("stop", f"must be a non-empty string or a list of them, got {value!r}")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequestField("stop", f"at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
    return list(stops)


def request_settings(body: dict, model_generation_config) -> RequestSettings:
    """Read and validate the settings of one request body.

    Args:
        body: the JSON body (chat or legacy completions).
        model_generation_config: the model's `generation_config` (the defaults).

    Raises:
        BadRequestField: naming the first bad field.
    """
    config, _, _ = resolve_generation_config(model_generation_config, None, {})
    config.max_length = None  # the server counts new tokens only
    present = {k: v for k, v in body.items() if v is not None}
    for name in UNUSED_AR_FIELDS:
        if name in present:
            _number(name, present[name], want_int=False)
            logger.warning_once(f"`{name}` is not used by block diffusion, which follows its own temperature "
                                "schedule from `t_max` to `t_min`; pass those instead.")
    token_field = "max_completion_tokens" if "max_completion_tokens" in present else "max_tokens"
    if token_field in present:
        max_new = _number(token_field, present[token_field], want_int=True)
        _checked(token_field, "max_new_tokens", max_new)
        config.max_new_tokens = max_new
    for name in CONFIG_FIELDS:
        if name in present:
            value = _number(name, present[name], want_int=name not in FLOAT_FIELDS)
            _checked(name, name, value)
            setattr(config, name, value)
    if config.max_denoising_steps > MAX_REQUEST_STEPS:
        where = "sent" if "max_denoising_steps" in present else "the model's generation_config"
        raise BadRequestField("max_denoising_steps", f"at most {MAX_REQUEST_STEPS} per request on this server, got "
                                                     f"{config.max_denoising_steps} ({where})")
    if "entropy_bound" in present:
        bound = _number("entropy_bound", present["entropy_bound"], want_int=False)
        if not bound > 0:
            raise BadRequestField("entropy_bound", f"must be > 0, got {bound!r}")
        config.sampler_config = EntropyBoundSamplerConfig(entropy_bound=bound)
    config.sampler_config = request_sampler_config(present, config.sampler_config, BadRequestField)  # `sampler`
    try:  # e.g. corrector_steps against this request's step budget
        check_sampler_config(config.sampler_config, config.max_denoising_steps)
    except ValueError as error:
        nested = present.get("sampler_settings")
        sent = {*present, *(f"sampler_settings.{k}" for k in (nested if isinstance(nested, dict) else {}))}
        field = next((n for n in ("corrector_steps", "sampler_settings.corrector_steps", "max_denoising_steps",
                                  "sampler_preset", "sampler") if n in sent), "sampler")
        raise BadRequestField(field, str(error)) from None
    config.stopper_config = request_stopper_config(present, config.stopper_config, BadRequestField)
    if not config.t_max > config.t_min:
        def cited(n):
            origin = "sent" if n in present else "this server's default"
            return f"{n}={getattr(config, n)} ({origin})"

        name = "t_max" if "t_max" in present or "t_min" not in present else "t_min"
        raise BadRequestField(name, f"`t_max` must be greater than `t_min`, got {cited('t_max')} <= {cited('t_min')}")
    try:
        config.validate()
    except ValueError as error:  # the model's own generation_config holds a bad value
        raise BadRequestField("generation_config", f"this server's generation config is invalid: {error}") from None
    seed = present.get("seed")
    if seed is not None:
        seed = _number("seed", seed, want_int=True)
        if not 0 <= seed <= SEED_MAX:
            raise BadRequestField("seed", f"must lie in [0, 2**32 - 1] (the CPU generator keeps 32 bits, so larger "
                                          f"seeds would repeat smaller ones), got {seed}")
    sampling = present.get("sampling", "fast")
    names = sorted(sampling_names(type(config.sampler_config)))
    if not isinstance(sampling, str) or sampling not in names:
        raise BadRequestField("sampling", f"must be one of {names}, got {sampling!r}")
    draft = draft_options(present, sampler_class_for(config.sampler_config, sampling).per_row, BadRequestField)
    prompt_field = "messages" if "messages" in body else "prompt"
    length_field = token_field if token_field in present else prompt_field
    return RequestSettings(config=config, max_new_tokens=config.max_new_tokens, seed=seed, sampling=sampling,
                           stop=stop_strings(present.get("stop")), stream_drafts=draft.drafts, draft=draft,
                           length_field=length_field, prompt_field=prompt_field)


def check_length(settings: RequestSettings, prompt_length: int, canvas_length: int, max_model_len: int,
                 requested_max_model_len: int | None = None) -> None:
    """The prompt plus whole canvases must fit the server's per-request room.

    Args:
        max_model_len: the room: `--max-model-len`, capped by the model's `max_position_embeddings`.
        requested_max_model_len: the `--max-model-len` given, when the model's limit capped it (named in the error).

    Raises:
        BadRequestField: naming the prompt field when the prompt is empty or leaves no room for one canvas, else the
            length field (`max_tokens`) when its canvases do not fit.
    """
    if prompt_length == 0:
        raise BadRequestField(settings.prompt_field, "the prompt is empty (0 tokens): send at least one token")
    room = f"this server's --max-model-len ({max_model_len})"
    if requested_max_model_len is not None and requested_max_model_len > max_model_len:
        room = (f"this server's limit of {max_model_len} tokens per request (--max-model-len "
                f"{requested_max_model_len}, capped by the model's max_position_embeddings)")
    if prompt_length + canvas_length > max_model_len:
        raise BadRequestField(settings.prompt_field, f"the prompt ({prompt_length} tokens) plus one canvas of "
                                                     f"{canvas_length} tokens exceed {room}: shorten the prompt")
    canvases = -(-settings.max_new_tokens // canvas_length)  # integer ceil: max_tokens may exceed a float
    if prompt_length + canvases * canvas_length > max_model_len:
        fit = (max_model_len - prompt_length) // canvas_length * canvas_length
        raise BadRequestField(settings.length_field, f"the prompt ({prompt_length} tokens) plus {canvases} "
                                                     f"canvas(es) of {canvas_length} tokens exceed {room}; at most "
                                                     f"{fit} new tokens fit after this prompt")
