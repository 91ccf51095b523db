"""Shared by the batch-invariance tests (tests/generation/test_invariant.py, tests/serving/test_serve_invariant.py):
irregular tiny configs and a recorder of every row's engine-step inputs and outputs."""

import collections

import torch

import diffusiongemma.generation.pool as pool_module

# irregular shapes: odd head counts and dims, top-k not dividing the experts, windows shorter than a prompt
CONFIGS = [
    dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=1, head_dim=12, intermediate_size=72,
         moe_intermediate_size=24, num_experts=5, top_k_experts=3, num_hidden_layers=3, canvas_length=8),
    dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=20, intermediate_size=136,
         moe_intermediate_size=44, num_experts=7, top_k_experts=2, sliding_window=5, num_hidden_layers=4),
    dict(hidden_size=200, num_attention_heads=4, num_key_value_heads=2, head_dim=52, global_head_dim=64,
         intermediate_size=328, moe_intermediate_size=120, num_experts=12, top_k_experts=3, sliding_window=13,
         vocab_size=1000, canvas_length=32, num_hidden_layers=3),
]


class StepLog:
    """Wraps the pool's engine step: per row id, every step's decoder hidden [L, H], its tempered logits [L, V]
    (the step's own `keep_logits` copy), entropy [L], self-conditioning input [L, H] and next canvas [L]."""

    def __init__(self, monkeypatch):
        self.rows = collections.defaultdict(list)
        inner = pool_module.denoise_rows

        def denoise_rows(model, plan, rows, keep_logits=False):
            out = inner(model, plan, rows, keep_logits=True)  # the tempered logits, kept (no other effect)
            for j, row_id in enumerate(rows.row_ids):
                self.rows[row_id].append((rows.hidden[j].clone(), out.logits[j], out.entropy[j].clone(),
                                          out.soft[j].clone(), out.canvas[j].clone()))
            return out

        monkeypatch.setattr(pool_module, "denoise_rows", denoise_rows)

    def take(self, row_id=None):
        rows = dict(self.rows)
        self.rows.clear()
        return rows if row_id is None else rows[row_id]


def bit_equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def random_config(seed: int) -> dict:
    """An irregular tiny config drawn at random: hidden sizes that are and are not multiples of 4 (grouped vs per
    expert MoE path on CPU), GQA ratios, odd head dims, windows, canvas lengths."""
    import random

    rng = random.Random(seed)
    kv = rng.choice([1, 2, 3])
    return dict(hidden_size=rng.choice([36, 42, 50, 64, 88]), num_attention_heads=kv * rng.choice([1, 2]),
                num_key_value_heads=kv, head_dim=rng.choice([8, 12, 18]), global_head_dim=rng.choice([16, 24]),
                intermediate_size=rng.choice([40, 66, 96]), moe_intermediate_size=rng.choice([12, 22, 32]),
                num_experts=rng.choice([3, 5, 6]), top_k_experts=rng.choice([1, 2]), sliding_window=rng.choice([3, 7]),
                num_hidden_layers=rng.choice([2, 3]), vocab_size=rng.choice([128, 301]),
                canvas_length=rng.choice([8, 12, 16]))


CONFIGS += [random_config(seed) for seed in (1, 2)]
