"""Proof that fine-tuning learns: a tiny model learns to copy 10 letters with Trainer (full fine-tuning), then a LoRA
adapter teaches it to shift every letter by one; each response (10 + EOS) spans two canvases of 8, and `generate`
solves held-out prompts. Measured first (64 held-out prompts each): copy 64/64 after 60 steps, shift 0/64 before
and 64/64 after 40 LoRA steps; the asserts (32 prompts) leave slack."""

import random

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Trainer, TrainingArguments

from diffusiongemma import DiffusionGemmaConfig, DiffusionGemmaDataCollator, DiffusionGemmaForBlockDiffusion
from conftest import tiny_tokenizer

L = 8
LETTERS = "abcdefgh"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def row(rng, shift=0):
    word = "".join(rng.choice(LETTERS) for _ in range(10))
    return {"prompt": word + "=", "completion": "".join(LETTERS[(LETTERS.index(c) + shift) % 8] for c in word)}


def copy_config():
    """Two layers (sliding window 64 covers prompt + canvases, then full attention), canvas 8."""
    return DiffusionGemmaConfig(vision_config=None, canvas_length=L, text_config=dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=16, num_global_key_value_heads=2, num_experts=2,
        top_k_experts=1, moe_intermediate_size=64, sliding_window=64, max_position_embeddings=256,
        final_logit_softcapping=30.0, layer_types=["sliding_attention", "full_attention"],
        pad_token_id=0, eos_token_id=1, bos_token_id=2))


def fit(model, rows, steps, lr, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=32,
                             learning_rate=lr, lr_scheduler_type="constant", remove_unused_columns=False,
                             report_to=[], use_cpu=True, save_strategy="no", logging_steps=10, disable_tqdm=True,
                             seed=0)
    collator = DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=L)
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def solved(model, shift, n=32):
    tok = tiny_tokenizer()
    rows = [row(random.Random(123 + i), shift) for i in range(n)]  # held out: other seeds than training
    batch = DiffusionGemmaDataCollator(tok, canvas_length=L)(rows)
    torch.manual_seed(1)
    with torch.no_grad():
        seq = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=16,
                             max_denoising_steps=8, eos_token_id=1, pad_token_id=0, return_dict_in_generate=False)
    new = seq[:, batch["input_ids"].shape[1]:].tolist()
    assert all(len(s) == 2 * L for s in new)  # two canvases
    answers = [tok.decode(s[: s.index(1)] if 1 in s else s) for s in new]
    return sum(a == r["completion"] for a, r in zip(answers, rows)) / n


@pytest.fixture(scope="module")
def copier(tmp_path_factory):
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(copy_config())
    model.config.ar_loss_weight = 0.0  # random-letter prompts: nothing to learn there
    rng = random.Random(0)
    losses = fit(model.train(), [row(rng) for _ in range(32 * 60)], 60, 3e-3, tmp_path_factory.mktemp("copy"))
    return model.eval(), losses


def test_full_fine_tuning_learns_to_copy_across_two_canvases(copier, one_thread):
    model, losses = copier
    assert losses[-1] < 0.1 * losses[0], losses  # measured (10-step means): 3.72 -> 0.071
    assert solved(model, 0) >= 0.9  # measured: 1.0


def test_lora_teaches_the_copier_a_new_mapping(copier, tmp_path, one_thread):
    model, _ = copier
    assert solved(model, 1) == 0  # the copier does not shift
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    rng = random.Random(5)
    losses = fit(lora.train(), [row(rng, 1) for _ in range(32 * 40)], 40, 1e-2, tmp_path)
    assert losses[-1] < 0.2 * losses[0], losses  # measured: 1.13 -> 0.058
    assert solved(lora.eval(), 1) >= 0.9  # measured: 1.0
