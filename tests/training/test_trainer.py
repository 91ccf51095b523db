"""transformers' `Trainer`, unchanged, on our model with `DiffusionGemmaDataCollator` (tiny model, CPU, fp32):
the loss comes from forward(labels=...), over responses of two canvases."""

import math

import datasets
import pytest
import torch
from transformers import Trainer, TrainingArguments

from diffusiongemma import DiffusionGemmaDataCollator, DiffusionGemmaForBlockDiffusion
from conftest import tiny_model, tiny_tokenizer

L = 16


def rows(n=8):
    # responses of 18-21 characters + EOS: two canvases each
    return [{"prompt": f"copy {i}:", "completion": ("abcdefghij"[i % 10:] + "klmnopqrstuvw")[:18 + i % 4]}
            for i in range(n)]


def args(tmp_path, **overrides):
    base = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, learning_rate=3e-3, report_to=[],
                use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True, remove_unused_columns=False,
                seed=0)
    base.update(overrides)
    return TrainingArguments(**base)


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.filterwarnings("error::FutureWarning")
def test_trainer_learns_saves_and_evaluates(tmp_path, one_thread):
    tok = tiny_tokenizer()
    collator = DiffusionGemmaDataCollator(tok, canvas_length=L)
    data = datasets.Dataset.from_list(rows())
    assert collator(list(data.select(range(4))))["labels"].shape == (4, 2 * L)
    model = tiny_model().train()
    trainer = Trainer(model=model, args=args(tmp_path, max_steps=30), train_dataset=data, eval_dataset=data,
                      data_collator=collator, processing_class=tok)
    result = trainer.train()
    seen = losses(trainer)
    assert result.global_step == 30 and len(seen) == 30
    assert sum(seen[-5:]) / 5 < 0.6 * sum(seen[:5]) / 5, seen
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"]) and metrics["eval_loss"] < seen[0]

    trainer.save_model(str(tmp_path / "model"))
    loaded = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "model").eval()
    batch = collator(rows(2))
    with torch.no_grad():
        canvas = torch.randint(0, 128, (2, L), generator=torch.Generator().manual_seed(0))
        a = model.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         decoder_input_ids=canvas).logits
        b = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=canvas).logits
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), loaded.state_dict().values()))
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)  # same weights; CPU kernels may round by alignment


def test_trainer_with_accumulation_checkpointing_and_tokenized_columns(tmp_path, one_thread):
    tok = tiny_tokenizer()
    collator = DiffusionGemmaDataCollator(tok, canvas_length=L)
    data = datasets.Dataset.from_list(rows()).map(collator.tokenize)  # input_ids / labels columns survive the pruning
    model = tiny_model().train()
    before = model.get_decoder().layers[0].self_attn.q_proj.weight.detach().clone()
    training = args(tmp_path, max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                    activation_checkpointing=True, remove_unused_columns=True)
    trainer = Trainer(model=model, args=training, train_dataset=data, data_collator=collator)
    result = trainer.train()
    assert result.global_step == 2 and math.isfinite(result.training_loss)
    assert model.get_decoder().gradient_checkpointing
    assert not torch.equal(model.get_decoder().layers[0].self_attn.q_proj.weight, before)


def test_trainer_bf16_autocast(tmp_path, one_thread):
    collator = DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=L)
    trainer = Trainer(model=tiny_model().train(), args=args(tmp_path, max_steps=2, bf16=True),
                      train_dataset=rows(4), data_collator=collator)
    result = trainer.train()
    assert math.isfinite(result.training_loss)


def test_trainer_pruned_columns_get_a_clear_error(tmp_path):
    collator = DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=L)
    trainer = Trainer(model=tiny_model().train(), args=args(tmp_path, max_steps=1, remove_unused_columns=True),
                      train_dataset=datasets.Dataset.from_list(rows(4)), data_collator=collator)
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        trainer.train()
