"""Checking a `from_pretrained(distributed_config=...)` request before transformers builds anything.

transformers' engine would fail late and obscurely on what it cannot shard (a world size that does not divide the
heads, a quantized checkpoint) or silently do something else (`device_map` with tensor parallelism). This module turns
those into ValueErrors naming the argument, and maps the expert-parallel-only form `DistributedConfig(ep_size=N,
tp_plan={})` onto a plan transformers 5.23 accepts (see `expert_parallel_only`).
"""

import dataclasses
import os

from .config import layer_shape
from .parallel import stack_plans

EP_ONLY_HINT = ("use expert parallelism alone, which keeps attention whole on every rank: "
                "DistributedConfig(ep_size=WORLD_SIZE, tp_plan={})")


def requested_parallelism(kwargs: dict):
    """The `DistributedConfig` a `from_pretrained` call asks for (given directly, as a dict, or through the deprecated
    `tp_plan` / `tp_size` keywords), or None when it asks for none."""
    from transformers import DistributedConfig

    request = kwargs.get("distributed_config")
    if isinstance(request, dict):
        return DistributedConfig.from_dict(request)
    if request is None and (kwargs.get("tp_plan") is not None or kwargs.get("tp_size") is not None):
        return DistributedConfig(tp_plan=kwargs.get("tp_plan"), tp_size=kwargs.get("tp_size"))
    return request


def expert_parallel_only(request, tp_plan: dict):
    """`ep_size=N, tp_plan={}` (the form transformers' own deprecation message recommends for expert parallelism
    alone) with the empty TP plan replaced by every rule of ours set to "replicate".

    transformers 5.23 derives `tp_size = WORLD_SIZE` from any `tp_plan`, then refuses `tp_size > 1` with an empty
    plan; "replicate" (a registered style that keeps the full parameter on every rank) passes that check and shards
    nothing, so attention, the embedding and the LM head stay whole and only the EP plan applies.
    """
    if request.ep_size <= 1 or request.tp_plan != {}:
        return request
    return dataclasses.replace(request, tp_plan=dict.fromkeys(tp_plan, "replicate"))


def _is_quantized(config, kwargs: dict) -> bool:
    return kwargs.get("quantization_config") is not None or getattr(config, "quantization_config", None) is not None


def check_divisible(text_config, tp_size: int, ep_size: int, shards_attention: bool) -> None:
    """Every sharded dimension splits evenly over its ranks.

    Raises:
        ValueError: naming the config field, its value and the world size; for attention it suggests expert
            parallelism (26B-A4B has 2 KV heads on its full-attention layers, so tensor parallelism stops at 2).
    """
    problems = []
    if shards_attention and tp_size > 1:
        fields = [("num_attention_heads", text_config.num_attention_heads)]
        for i in range(text_config.num_hidden_layers):
            shape = layer_shape(text_config, i)
            fields.append((f"num_key_value_heads of layer {i} ({shape.layer_type})", shape.num_kv_heads))
        problems += [f"{name} = {value} is not divisible by tp_size = {tp_size}" for name, value in fields
                     if value % tp_size]
        if problems:
            problems.append(EP_ONLY_HINT)
    if tp_size > 1 and ep_size <= 1 and text_config.moe_intermediate_size % tp_size:
        problems.append(f"moe_intermediate_size = {text_config.moe_intermediate_size} is not divisible by tp_size = "
                        f"{tp_size} (tensor parallelism splits every expert's gate and up rows)")
    if ep_size > 1 and text_config.num_experts % ep_size:
        problems.append(f"num_experts = {text_config.num_experts} is not divisible by ep_size = {ep_size}")
    if problems:
        raise ValueError("distributed_config cannot shard this model: " + "; ".join(problems))


def shards_attention(tp_plan: dict, request) -> bool:
    """Whether the resolved TP plan splits the attention projections over heads."""
    plan = {**tp_plan, **request.tp_plan} if isinstance(request.tp_plan, dict) else tp_plan
    projections = ("q_proj", "k_proj", "v_proj")
    return any(key.rsplit(".", 1)[-1] in projections and style.startswith("colwise") for key, style in plan.items())


def prepare_parallel_load(cls, path, kwargs: dict) -> dict:
    """`from_pretrained` kwargs checked for a tensor- or expert-parallel request (unchanged when there is none).

    Raises:
        ValueError: `device_map` together with tensor/expert parallelism; a quantized checkpoint or
            `quantization_config` together with it; a size that does not divide heads, KV heads or experts.
    """
    request = requested_parallelism(kwargs)
    if request is None or (request.tp_size <= 1 and request.ep_size <= 1):
        return kwargs
    if kwargs.get("device_map") is not None:
        raise ValueError(
            f"device_map={kwargs['device_map']!r} cannot be combined with tensor or expert parallelism "
            f"(tp_size={request.tp_size}, ep_size={request.ep_size}): under torchrun every rank places its own shard "
            "on its own device (LOCAL_RANK). Drop device_map, or drop distributed_config to spread layers with "
            "accelerate on one process."
        )
    config = kwargs.get("config")
    if config is None:
        hub = {k: kwargs[k] for k in ("subfolder", "revision", "cache_dir", "token", "local_files_only") if k in kwargs}
        config = cls.config_class.from_pretrained(os.fspath(path), **hub)
    if _is_quantized(config, kwargs):
        raise ValueError(
            f"a quantized checkpoint or quantization_config cannot be loaded with tensor or expert parallelism "
            f"(tp_size={request.tp_size}, ep_size={request.ep_size}): the parallel plan shards the bf16 layout "
            "(fused experts.gate_up_proj, dense Linears), while FP8 / NVFP4 checkpoints store per-expert quantized "
            "Linears and bitsandbytes packs its weights, which no plan rule can split. Load the bf16 checkpoint "
            "with distributed_config, or the quantized one on a single process."
        )
    tp_plan, _ = stack_plans(config.get_text_config())
    request = expert_parallel_only(request, tp_plan)
    check_divisible(config.get_text_config(), request.tp_size, request.ep_size, shards_attention(tp_plan, request))
    if kwargs.get("distributed_config") is None:
        return kwargs  # the deprecated keywords: transformers builds the same request from them
    return {**kwargs, "distributed_config": request}
