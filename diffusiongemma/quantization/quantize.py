"""Write a compressed-tensors checkpoint (FP8 dynamic or NVFP4) from a dense DiffusionGemma checkpoint (spec F).

The output has the layout published quantized releases use (spec F.3): experts split into per-expert Linears
`experts.{e}.{gate,up,down}_proj` (gate = first half of the fused `gate_up_proj` rows, up = second half) and
quantized like every other Linear; `ignore` keeps lm_head, embeddings, routers, the vision tower, its projector and
self-conditioning in the source dtype. config.json gets the `quantization_config` compressed-tensors itself writes
(`ModelCompressor.update_config`): group `group_0`, status "compressed", format "float-quantized" or
"nvfp4-pack-quantized".

NVFP4 activations need a static `input_global_scale` per Linear: `448 · 6 / amax(input)` over a calibration set.
Every expert is calibrated on all tokens (not only the ones routed to it), so rarely routed experts still get a
sensible scale. NVFP4 weight global scales are shared by fused partners the way LLM Compressor does (spec F.4):
gate/up pairs use the smaller of the two, and q/k/v when all three exist.

Memory: the dense model is loaded once; quantized tensors are written shard by shard.
"""

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from safetensors.torch import save_file
from torch import nn

from transformers import AutoModelForCausalLM, AutoTokenizer

from diffusiongemma.io.atomic import atomic_folder, holds_checkpoint
from diffusiongemma.io.config_files import read_quantization_config
from diffusiongemma.io.tokenizer_files import folder_has_tokenizer
from diffusiongemma.modeling.weights import ENCODER_TEXT_PREFIX
from diffusiongemma.quantization.experts import ExpertList, unfuse_model_experts
from diffusiongemma.quantization.fp8 import quantize_fp8_weight
from diffusiongemma.quantization.nvfp4 import nvfp4_global_scale, quantize_nvfp4_weight
from diffusiongemma.quantization.schemes import FP8_DYNAMIC, FORMAT_OF, NVFP4, quantization_plan

PRESET_OF = {FP8_DYNAMIC: "FP8_DYNAMIC", NVFP4: "NVFP4"}
SCHEMES = tuple(PRESET_OF)

# Regexes in the style of model_free_ptq (spec F.4); embeddings are not Linears but are listed for readers.
DEFAULT_IGNORE = [
    "lm_head",
    "re:.*embed_tokens$",
    "re:.*router.*",
    "re:.*vision_tower.*",
    "re:.*embed_vision.*",
    "re:.*self_conditioning.*",
]

# Default NVFP4 calibration prompts: short, varied (chat, code, maths, lists, other languages).
DEFAULT_CALIBRATION_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Explain how a transformer language model works in two sentences.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "What is 17 multiplied by 23? Show your steps.",
    "Write a haiku about autumn leaves.",
    "List three uses of a paperclip.",
    "La capitale de la France est Paris, et elle est connue pour",
    "Der schnellste Weg zum Bahnhof ist",
    "SELECT name, COUNT(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "Summarize: The meeting was moved to Thursday because the room was booked.",
    "Translate to Spanish: Where is the nearest pharmacy?",
    "A train leaves at 3pm travelling 60 km/h. When does it cover 150 km?",
    "<html><body><h1>Hello</h1></body></html>",
    "Once upon a time, in a village by the sea, there lived",
    "Give me a JSON object with fields name and age.",
    "Why is the sky blue?",
]


def quantization_config_for(scheme: str, ignore: list[str] | None = None) -> QuantizationConfig:
    """The compressed-tensors config `quantize_model` writes: preset `scheme` on every Linear, `ignore` skipped."""
    if scheme not in PRESET_OF:
        raise ValueError(f"unknown scheme {scheme!r}; supported: {', '.join(SCHEMES)}")
    return QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(PRESET_OF[scheme], ["Linear"])},
        ignore=list(DEFAULT_IGNORE if ignore is None else ignore),
        format=FORMAT_OF[scheme],
        quantization_status="compressed",
    )


def calibration_ids(prompts: list[str], tokenizer, vocab_size: int, seed: int = 0) -> list[torch.Tensor]:
    """Token ids [1, P] per prompt: `tokenizer` when given, else random ids (length ~ characters / 4)."""
    if tokenizer is not None:
        return [tokenizer(p, return_tensors="pt")["input_ids"] for p in prompts]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (1, max(4, len(p) // 4)), generator=g) for p in prompts]


@torch.no_grad()
def calibrate_input_global_scales(model: nn.Module, names: list[str], inputs: list[torch.Tensor]) -> dict:
    """{Linear name: input_global_scale [1] fp32} from `448 · 6 / amax(input)` over `inputs` (spec F.2).

    Expert Linears see every token of their layer (each `ExpertList` runs all experts on its whole input during
    calibration), so no expert is left without a scale.
    """
    amax = {n: torch.zeros(()) for n in names}
    handles = []
    for name in names:
        def observe(module, args, name=name):
            amax[name] = torch.maximum(amax[name], args[0].detach().abs().amax().float().cpu())
        handles.append(model.get_submodule(name).register_forward_pre_hook(observe))
    for module in model.modules():
        if isinstance(module, ExpertList):
            def all_experts(module, args):
                for expert in module:
                    expert(args[0])
            handles.append(module.register_forward_pre_hook(all_experts))
    try:
        for ids in inputs:
            model(input_ids=ids.to(model.device))
    finally:
        for h in handles:
            h.remove()
    return {n: nvfp4_global_scale(a.reshape(1)) for n, a in amax.items()}


def shared_weight_global_scales(model: nn.Module, names: list[str]) -> dict:
    """NVFP4 weight global scales, fused partners sharing the minimum (spec F.4)."""
    scales = {n: nvfp4_global_scale(model.get_submodule(n).weight.detach()) for n in names}
    groups = {}
    for n in names:
        parent, _, leaf = n.rpartition(".")
        if leaf in ("gate_proj", "up_proj"):
            groups.setdefault((parent, "gate_up"), []).append(n)
        elif leaf in ("q_proj", "k_proj", "v_proj"):
            groups.setdefault((parent, "qkv"), []).append(n)
    for (_, kind), members in groups.items():
        if len(members) == (2 if kind == "gate_up" else 3):
            shared = torch.stack([scales[m] for m in members]).min(dim=0).values
            scales.update(dict.fromkeys(members, shared))
    return scales


def quantized_tensors(model: nn.Module, scheme: str, plan: dict, input_scales: dict, weight_scales: dict
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint key, tensor) for everything the compressed checkpoint holds, in state-dict order."""
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if model.config.tie_word_embeddings else set()
    for key, value in model.state_dict().items():
        module_name, _, attr = key.rpartition(".")
        if key in tied or (key.startswith(ENCODER_TEXT_PREFIX) and not key.endswith("layer_scalar")):
            continue
        if module_name not in plan or attr != "weight":
            yield key, value.detach().contiguous()
            continue
        w = value.detach()
        if scheme == FP8_DYNAMIC:
            qweight, scale = quantize_fp8_weight(w)
            yield f"{module_name}.weight", qweight
            yield f"{module_name}.weight_scale", scale
        else:
            packed, scale, global_scale = quantize_nvfp4_weight(w, weight_scales[module_name])
            yield f"{module_name}.weight_packed", packed
            yield f"{module_name}.weight_scale", scale
            yield f"{module_name}.weight_global_scale", global_scale
            yield f"{module_name}.input_global_scale", input_scales[module_name]


def save_sharded(tensors: Iterator[tuple[str, torch.Tensor]], dst: str, max_shard_bytes: int = 5 * 2**30) -> int:
    """Write safetensors shards as the tensors arrive (+ an index when there is more than one); returns total bytes."""
    written, current, size, total = [], {}, 0, 0

    def flush(shard: dict) -> None:
        tmp = os.path.join(dst, f".shard-{len(written)}.safetensors")
        save_file(shard, tmp, metadata={"format": "pt"})
        written.append((tmp, list(shard)))

    for key, t in tensors:
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_shard_bytes:
            flush(current)
            current, size = {}, 0
        current[key] = t.cpu().clone() if t.data_ptr() in {v.data_ptr() for v in current.values()} else t.cpu()
        size += nbytes
        total += nbytes
    flush(current)
    if len(written) == 1:
        os.replace(written[0][0], os.path.join(dst, "model.safetensors"))
        return total
    weight_map = {}
    for i, (tmp, keys) in enumerate(written):
        name = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        os.replace(tmp, os.path.join(dst, name))
        weight_map.update(dict.fromkeys(keys, name))
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return total


def quantize_model(model: nn.Module, scheme: str, calibration: list[torch.Tensor] | None = None,
                   ignore: list[str] | None = None) -> tuple[QuantizationConfig, dict, dict, dict]:
    """Unfuse the experts of a dense `model` (in place) and compute what its compressed checkpoint needs.

    Returns:
        (quantization config, plan {Linear name: ModuleScheme}, input global scales, weight global scales); the
        scale dicts are empty for FP8.
    """
    qconfig = quantization_config_for(scheme, ignore)
    unfuse_model_experts(model)
    plan = quantization_plan(model, qconfig)
    input_scales, weight_scales = {}, {}
    if scheme == NVFP4:
        input_scales = calibrate_input_global_scales(model, list(plan), calibration or [])
        weight_scales = shared_weight_global_scales(model, list(plan))
    return qconfig, plan, input_scales, weight_scales


def check_not_quantized(src: str) -> None:
    """ValueError if `src`'s config.json has a `quantization_config`: its Linears would load compressed (FP8 / NVFP4)
    or as bitsandbytes modules, none of which is a plain Linear to quantize, and re-quantizing rounded weights
    compounds the error."""
    raw = read_quantization_config(src)
    if raw is None:
        return
    kind = raw.get("quant_method", "unknown method") if isinstance(raw, dict) else type(raw).__name__
    fmt = f", format {raw['format']}" if isinstance(raw, dict) and raw.get("format") else ""
    raise ValueError(f"{src} is already quantized ({kind}{fmt}); quantize the unquantized (bf16) checkpoint it was "
                     "made from instead")


def dense_model(src: str) -> nn.Module:
    """The dense checkpoint `src` as the public class, through `AutoModelForCausalLM` (importing `diffusiongemma`
    registers the class there): quantization sits below the public class, which loads quantized checkpoints with it,
    so it never imports the class itself (tests/test_layering.py).

    Raises:
        ValueError: `src` holds another model type, which the Auto class maps to another class.
    """
    model = AutoModelForCausalLM.from_pretrained(src)
    if type(model).__module__.split(".")[0] != "diffusiongemma":
        raise ValueError(f"{src} is not a DiffusionGemma checkpoint (model_type {model.config.model_type!r} loads as "
                         f"{type(model).__name__}); `diffusiongemma quantize` quantizes DiffusionGemma checkpoints")
    return model.eval()


def quantize_checkpoint(src: str, dst: str, scheme: str, prompts: list[str] | None = None,
                        max_shard_bytes: int = 5 * 2**30, overwrite: bool = False) -> dict:
    """`diffusiongemma quantize`: read the dense checkpoint folder `src`, write a compressed one to `dst`.

    Args:
        src: dense checkpoint folder (config.json, safetensors, optional tokenizer and generation config).
        dst: output folder (created); non-weight files of `src` are copied.
        scheme: "fp8-dynamic" or "nvfp4".
        prompts: NVFP4 calibration prompts (default `DEFAULT_CALIBRATION_PROMPTS`), tokenized with `src`'s tokenizer
            when it has one, else replaced by random ids.
        max_shard_bytes: safetensors shard size (a positive int; a shard always holds at least one tensor).
        overwrite: replace a `dst` that already holds a checkpoint (refused otherwise, before any work). The folder is
            written atomically (`diffusiongemma.io.atomic_folder`): an interrupted run leaves the old `dst` complete,
            and nothing of the old checkpoint (stale shards or index) survives a finished one.

    Returns:
        {"quantized_linears": n, "bytes": checkpoint bytes, "calibration": "tokenizer" | "random ids" | None}.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; supported: {', '.join(SCHEMES)}")
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes <= 0:
        raise ValueError(f"`max_shard_bytes` must be a positive int, got {max_shard_bytes!r}")
    if not os.path.isdir(src):  # before the Auto class, which would read a missing path as a Hub repo id
        raise FileNotFoundError(f"model folder {src} does not exist")
    if os.path.abspath(src) == os.path.abspath(dst):
        raise ValueError(f"the output folder must differ from the source folder ({src}): quantize into a new folder")
    if not overwrite and holds_checkpoint(Path(dst)):  # refuse before the (long) quantization, not after
        raise FileExistsError(f"{dst} already holds a checkpoint: pass overwrite=True (--overwrite) to replace it")
    check_not_quantized(src)
    model = dense_model(src)
    calibration, source = None, None
    if scheme == NVFP4:
        tokenizer, source = None, "random ids"
        if folder_has_tokenizer(src):
            tokenizer, source = AutoTokenizer.from_pretrained(src), "tokenizer"
        calibration = calibration_ids(prompts or DEFAULT_CALIBRATION_PROMPTS, tokenizer,
                                      model.config.text_config.vocab_size)
    qconfig, plan, input_scales, weight_scales = quantize_model(model, scheme, calibration)
    with atomic_folder(dst, overwrite=overwrite) as work:
        for name in os.listdir(src):
            if not name.endswith(".safetensors") and name not in ("model.safetensors.index.json", "config.json") \
                    and os.path.isfile(os.path.join(src, name)):
                shutil.copy2(os.path.join(src, name), os.path.join(work, name))
        model.config.save_pretrained(work)
        ModelCompressor(quantization_config=qconfig).update_config(str(work))
        tensors = quantized_tensors(model, scheme, plan, input_scales, weight_scales)
        total = save_sharded(tensors, str(work), max_shard_bytes)
    return {"quantized_linears": len(plan), "bytes": total, "calibration": source}
