"""Tensor and expert parallelism through transformers' own engine (`from_pretrained(distributed_config=...)`).

transformers shards a model by the plans it finds on the model: `{module or parameter pattern: style}`. The text
config we reuse declares `base_model_tp_plan` / `base_model_ep_plan` for a text stack at the root (`layers.*.
self_attn.q_proj`, ...); ours sits at `model.decoder` (the checkpoint prefix, spec B.1), so `stack_plans` puts that
prefix in front. Two entries are ours:

* `lm_head`: "colwise_gather_output": each rank computes its slice of the vocabulary, and the slices are gathered,
  so sampling and self-conditioning see all V logits on every rank;
* `model.decoder.embed_tokens`: "embedding_rowwise": the embedding is tied to `lm_head` (spec B.2), so it holds the
  same vocabulary slice; the lookup runs on the slice and the ranks' partial rows are summed (exact: one rank holds
  the row, the others add zeros). transformers' built-in class gives its encoder embedding this rule but none to its
  decoder stack, which owns the tied weight: the hooked lookup then meets a plain weight (`mixed torch.Tensor and
  DTensor`). Our one stack serves both modes, so one rule covers both.

The self-conditioning soft embedding multiplies a distribution by the whole embedding matrix; `soft_embedding_rows`
does it on the rank's vocabulary slice and sums the ranks' partial products (a different summation order than one
process: see docs/distributed.md for the tolerance).

Legend: B batch, L canvas, V vocab, H hidden, N heads, K kv heads, E experts.
"""

import torch
from torch import nn

STACK = "model.decoder."
HEAD_PLAN = {"lm_head": "colwise_gather_output", STACK + "embed_tokens": "embedding_rowwise"}


def stack_plans(text_config) -> tuple[dict, dict]:
    """(tp plan, ep plan) for our module paths: the text config's plans under `model.decoder.`, plus `HEAD_PLAN`
    in the TP plan (the EP plan leaves the head and embedding replicated, as it does attention)."""
    tp = {STACK + k: v for k, v in (getattr(text_config, "base_model_tp_plan", None) or {}).items()}
    ep = {STACK + k: v for k, v in (getattr(text_config, "base_model_ep_plan", None) or {}).items()}
    return ({**HEAD_PLAN, **tp} if tp else {}), ep


def add_stack_plans(model: nn.Module) -> None:
    """Merge `stack_plans` into a model's instance plans (called from `init_parallel_plans`, in `post_init`)."""
    tp, ep = stack_plans(model.config.get_text_config())
    model._tp_plan = {**tp, **(model._tp_plan or {})}
    model._ep_plan = {**ep, **(model._ep_plan or {})}


def is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(t, DTensor)


def soft_embedding_rows(probs: torch.Tensor, weight) -> torch.Tensor:
    """probs [B, L, V] (the same on every rank) @ weight [V, H] when `weight` is a DTensor sharded on the vocabulary:
    each rank multiplies its vocabulary slice, then one all-reduce sums the partial [B, L, H] products.

    DTensor propagates the layouts (replicated probs times Shard(0) weight gives a Partial result); `full_tensor`
    runs the all-reduce, with autograd.
    """
    from torch.distributed.tensor import DTensor, Replicate

    spread = DTensor.from_local(probs, weight.device_mesh, [Replicate()], run_check=False)
    return (spread @ weight).full_tensor()  # [B, L, H], summed over ranks
