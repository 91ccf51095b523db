"""The lm-evaluation-harness model "diffusiongemma": lm-eval's three request types on a block-diffusion checkpoint.

    lm_eval.simple_evaluate(model="diffusiongemma", model_args="pretrained=PATH,dtype=float32,batch_size=8", ...)

* `generate_until`: our `generate` (its default batching: the row pool for per-row samplers), `until` stop strings
  (early at canvas granularity, exact after the fact: `stops.py`), `max_gen_toks` (generation runs whole canvases;
  the answer keeps the first `max_gen_toks` tokens), chat templates through `apply_chat_template`.
* `loglikelihood`: the block-diffusion ELBO estimate of `elbo.py` (`mc_samples` Monte Carlo samples per request,
  seeded by `seed` and the context), `is_greedy` = the continuation is the denoiser's argmax fixed point.
* `loglikelihood_rolling`: the text in lm-eval's disjoint rolling windows of `max_length` tokens, each window's
  continuation scored as in `loglikelihood`, summed.

Model args (see docs/evaluation.md): pretrained, tokenizer, dtype, device, device_map, peft, batch_size,
max_denoising_steps, sampler_preset, sampling, seed, mc_samples, mc_batch_size, max_length, max_gen_toks.
"""

import logging

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from ..cli_types import dtype_arg
from .elbo import DEFAULT_SAMPLES, continuation_loglikelihood
from .stops import StopStringsInCanvas, cut_at_stop_strings

logger = logging.getLogger(__name__)

# lm-eval's autoregressive sampling knobs: block diffusion samples with its own temperature schedule (t_max -> t_min)
# and has no greedy mode, so these are not passed to `generate` (a warning says so once).
AR_KNOBS = ("do_sample", "temperature", "top_p", "top_k")


def _positive(name: str, value, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"model arg `{name}` must be a positive integer, got {value!r}")
    return value


def load_model(pretrained: str, dtype="auto", device: str | None = None, device_map=None, peft: str | None = None):
    """The checkpoint (dense, quantized or bitsandbytes: `from_pretrained` tells them apart) in eval mode, with a PEFT
    adapter merged in when `peft` names one."""
    from ..model import DiffusionGemmaForBlockDiffusion
    from ..modeling.config import check_model_folder

    check_model_folder(pretrained)
    torch_dtype = dtype_arg(dtype) if isinstance(dtype, str) else dtype
    kwargs = {"dtype": torch_dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(pretrained, **kwargs)
    if peft is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, peft).merge_and_unload()
    if device_map is None:
        model = model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return model.eval()


def passes_per_row(new_tokens: torch.Tensor, tokens_per_forward: torch.Tensor, pad_id: int | None) -> list[int]:
    """Denoising passes per row, from `generate`'s tokens_per_forward = non-pad new tokens / passes (spec D.6)."""
    counted = (new_tokens != pad_id).sum(dim=1) if pad_id is not None else torch.full(
        (new_tokens.shape[0],), new_tokens.shape[1])
    return [round(c / t) if t > 0 else 0 for c, t in zip(counted.tolist(), tokens_per_forward.tolist())]


@register_model("diffusiongemma")
class DiffusionGemmaLM(TemplateLM):
    """A `DiffusionGemmaForBlockDiffusion` checkpoint as an lm-eval model (module docstring; docs/evaluation.md).

    After a run, `generation_passes` holds the denoising passes of every generated answer and `elbo_standard_errors`
    the standard error of every log-likelihood estimate (the `diffusiongemma eval` command summarizes both).
    """

    def __init__(self, pretrained: str, tokenizer: str | None = None, dtype="auto", device: str | None = None,
                 device_map=None, peft: str | None = None, batch_size=8, max_batch_size=None,
                 max_denoising_steps: int | None = None, sampler_preset: str | None = None,
                 sampling: str | None = None, seed: int = 0, mc_samples: int = DEFAULT_SAMPLES,
                 mc_batch_size: int | None = None, max_length: int | None = None, max_gen_toks: int | None = None,
                 add_bos_token: bool | None = None):
        super().__init__()
        from transformers import AutoTokenizer

        from ..generation.sampler_presets import sampler_preset as preset_config

        if isinstance(batch_size, str) and batch_size.startswith("auto"):
            raise ValueError("model arg `batch_size=auto` is not supported: pass a number (rows per generate call)")
        self.batch_size = _positive("batch_size", int(batch_size) if isinstance(batch_size, str) else batch_size,
                                    allow_none=False)
        self.mc_samples = _positive("mc_samples", mc_samples, allow_none=False)
        self.mc_batch_size = _positive("mc_batch_size", mc_batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"model arg `seed` must be an integer >= 0, got {seed!r}")
        self.seed = seed
        self.overrides = {}
        if max_denoising_steps is not None:
            self.overrides["max_denoising_steps"] = _positive("max_denoising_steps", max_denoising_steps)
        if sampler_preset is not None:
            try:
                self.overrides["sampler_config"] = preset_config(sampler_preset, "sampler_preset")
            except ValueError as error:
                raise ValueError(f"model arg `sampler_preset`: {error}") from None
        if sampling is not None:
            self.overrides["sampling"] = sampling
        self.model = load_model(pretrained, dtype, device, device_map, peft)
        self._device = self.model.device
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or pretrained)
        self.pretrained = pretrained
        text = self.model.config.text_config
        self.max_length = _positive("max_length", max_length) or text.max_position_embeddings
        self.max_gen_toks = _positive("max_gen_toks", max_gen_toks) or (
            self.model.generation_config.max_new_tokens or self.model.canvas_length)
        self.add_bos_token = add_bos_token
        self.generation_passes: list[int] = []
        self.elbo_standard_errors: list[float] = []

    # -- tokenization -------------------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Ids of `string`. Special tokens: `add_special_tokens` when given, else the `add_bos_token` model arg,
        else the tokenizer's default unless the string already starts with the BOS text (a chat template's)."""
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token
        if add_special_tokens is None:
            bos = self.tokenizer.bos_token
            add_special_tokens = not (bos and string.startswith(bos))
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"--apply_chat_template: the tokenizer of {self.pretrained} has no chat template")
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    # -- log-likelihoods ----------------------------------------------------------------------------------------
    def _score(self, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
        L = self.model.canvas_length
        canvases = -(-len(continuation_ids) // L)
        if len(context_ids) + canvases * L > self.max_length:
            raise ValueError(f"a request's context ({len(context_ids)} tokens) and continuation ({canvases} canvas(es) "
                             f"of {L}) exceed max_length {self.max_length}; raise the `max_length` model arg if the "
                             "model's positions allow it")
        est = continuation_loglikelihood(self.model, context_ids, continuation_ids, self.mc_samples, self.seed,
                                         self.mc_batch_size)
        self.elbo_standard_errors.append(est.standard_error)
        return est.loglikelihood, est.is_greedy

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        results = []
        for key, context_ids, continuation_ids in tqdm(requests, desc="ELBO log-likelihoods", disable=disable_tqdm):
            result = self._score(context_ids, continuation_ids)
            self.cache_hook.add_partial("loglikelihood", key, result)
            results.append(result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text in disjoint windows (lm-eval's rolling windows): a window of up to max_length - L tokens is one
        continuation after its context (the BOS/EOS prefix, then the text before it), so every token is scored
        once, and the padded last canvas still fits in max_length."""
        width = self.max_length - self.model.canvas_length
        if width < 2:
            raise ValueError(f"max_length {self.max_length} leaves no room beyond one canvas "
                             f"({self.model.canvas_length}); raise the `max_length` model arg")
        results = []
        for (text,) in tqdm([r.args for r in requests], desc="ELBO rolling log-likelihoods", disable=disable_tqdm):
            windows = map(make_disjoint_window, get_rolling_token_windows(
                self.tok_encode(text, add_special_tokens=False), self.prefix_token_id, width, 1))
            total = sum(self._score(context, continuation)[0] for context, continuation in windows)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            results.append(total)
        return results

    # -- generation ---------------------------------------------------------------------------------------------
    def _gen_settings(self, gen_kwargs: dict) -> tuple[list[str], int]:
        """(stop strings, max_gen_toks) of one request's gen_kwargs; unknown keys are an error naming them."""
        kwargs = dict(gen_kwargs)
        until = kwargs.pop("until", None)
        stops = [until] if isinstance(until, str) else list(until or [])
        if not all(isinstance(s, str) for s in stops):
            raise ValueError(f"gen_kwargs `until` must be a string or a list of strings, got {until!r}")
        max_gen = _positive("max_gen_toks (gen_kwargs)", kwargs.pop("max_gen_toks", None)) or self.max_gen_toks
        knobs = {k: kwargs.pop(k) for k in AR_KNOBS if k in kwargs}
        if knobs:
            logger.warning("gen_kwargs %s are not used: block diffusion samples with its own temperature schedule "
                           "(t_max -> t_min of the generation config; see docs/evaluation.md)", knobs)
        if kwargs:
            raise ValueError(f"gen_kwargs {sorted(kwargs)} are not supported by the diffusiongemma model (supported: "
                             f"until, max_gen_toks; ignored with a warning: {', '.join(AR_KNOBS)})")
        return stops, max_gen

    def _generate_batch(self, contexts: list[str], stops: list[str], max_gen: int) -> list[str]:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else \
            self.model.config.text_config.pad_token_id
        rows = [self.tok_encode(c) for c in contexts]
        P = max(len(r) for r in rows)
        input_ids = torch.tensor([[pad] * (P - len(r)) + r for r in rows], device=self.device)  # [B, P] left pad
        mask = None  # without padding, no mask: the call is the plain `generate(input_ids)` others make
        if any(len(r) < P for r in rows):
            mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows], device=self.device)
        criteria = [StopStringsInCanvas(self.tokenizer, stops)] if any(stops) else None
        with torch.no_grad():
            out = self.model.generate(input_ids, attention_mask=mask, max_new_tokens=max_gen,
                                      stopping_criteria=criteria, return_dict_in_generate=True, **self.overrides)
        new = out.sequences[:, P:]  # [B, c*L]
        self.generation_passes += passes_per_row(new, out.tokens_per_forward, pad)
        eos = set(self.model.generation_config.eos_token_id if isinstance(
            self.model.generation_config.eos_token_id, list) else [self.model.generation_config.eos_token_id])
        answers = []
        for row in new.tolist():
            row = row[:max_gen]  # whole canvases were generated; the answer keeps max_gen_toks tokens
            end = next((i for i, t in enumerate(row) if t in eos), len(row))
            text = self.tokenizer.decode(row[:end], skip_special_tokens=True)
            answers.append(cut_at_stop_strings(text, stops))
        return answers

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Requests in their order, `batch_size` consecutive ones with the same gen_kwargs per `generate` call.
        With `seed`, the global torch RNG is seeded once here (reference samplers draw from it; per-row samplers draw
        their row seeds from it), so the answers are a function of the seed and the request order."""
        torch.manual_seed(self.seed)
        args = [r.args for r in requests]
        answers: list[str] = []
        bar = tqdm(total=len(args), desc="generating", disable=disable_tqdm)
        i = 0
        while i < len(args):
            gen_kwargs = args[i][1]
            j = i + 1
            while j < len(args) and j - i < self.batch_size and args[j][1] == gen_kwargs:
                j += 1
            stops, max_gen = self._gen_settings(gen_kwargs)
            batch = self._generate_batch([context for context, _ in args[i:j]], stops, max_gen)
            for (context, kwargs), answer in zip(args[i:j], batch):
                self.cache_hook.add_partial("generate_until", (context, kwargs), answer)
            answers += batch
            bar.update(j - i)
            i = j
        bar.close()
        return answers
