"""Supervised fine-tuning with transformers' `Trainer`: the run behind `diffusiongemma train sft`.

    rows (JSON lines / datasets folder) -> checked and tokenized (data.py) -> Trainer(model or LoRA model,
    DiffusionGemmaDataCollator) -> OUT/ (model + tokenizer; with LoRA also OUT/adapter/)

Trainer supplies the progress bar, gradient accumulation, checkpoints every `save_steps` in OUT/checkpoints/
(weights or adapter, optimizer, scheduler, RNG states) and resuming from the newest one. `SFTTrainer`
(checkpoints.py) makes each checkpoint atomic and stops on a non-finite loss; `--resume` continues from the newest
complete checkpoint. Non-finite or negative settings are refused before anything is loaded (`check_sft_config`).
"""

import math
import os
from dataclasses import dataclass

import torch

from .checkpoints import SFTTrainer, check_finite_weights, newest_complete_checkpoint
from .collator import DiffusionGemmaDataCollator
from .data import read_rows, token_count, tokenize_rows

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class SFTConfig:
    """Settings of one fine-tuning run (the `diffusiongemma train sft` options)."""

    model: str
    data: str
    out: str
    lora: bool = False
    lora_rank: int = 16
    epochs: float = 1.0
    lr: float | None = None  # default: 1e-4 full, 1e-3 LoRA
    batch_size: int = 8
    grad_accum: int = 1
    max_length: int | None = None
    ar_weight: float = 1.0
    save_steps: int = 200
    seed: int = 0
    device: str = "cpu"
    bf16: bool = False
    resume: bool = False
    quiet: bool = False

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (1e-3 if self.lora else 1e-4)


def check_sft_config(cfg: SFTConfig) -> None:
    """ValueError naming the option for a setting that cannot train: a learning rate or epoch count that is not a
    finite number > 0, an AR weight that is not a finite number >= 0."""
    numbers = {"--lr (lr)": (cfg.lr, "> 0"), "--epochs (epochs)": (cfg.epochs, "> 0"),
               "--ar-weight (ar_weight)": (cfg.ar_weight, ">= 0")}
    for name, (value, bound) in numbers.items():
        if value is None and name.startswith("--lr"):
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
            value > 0 if bound == "> 0" else value >= 0)
        if not ok:
            raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def lora_model(model, rank: int):
    """`model` wrapped with LoRA adapters of `rank` on the Gemma target list (text stack, self-conditioning and
    vision tower projections)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                            target_modules=LORA_TARGETS))


def run_sft(cfg: SFTConfig, log=print) -> dict:
    """Fine-tune `cfg.model` on `cfg.data`; returns {"out", "steps", "train_loss", "rows", "tokens"}."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    check_sft_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    # the package registers its class for AutoModelForCausalLM (diffusiongemma/__init__.py); the class itself lives
    # above this layer (tests/test_layering.py)
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    if type(model).__name__ != "DiffusionGemmaForBlockDiffusion" or type(model).__module__.split(".")[0] != \
            "diffusiongemma":
        raise ValueError(f"--model {cfg.model} loaded as {type(model).__module__}.{type(model).__name__}, not "
                         "diffusiongemma's DiffusionGemmaForBlockDiffusion")
    collator = DiffusionGemmaDataCollator(tokenizer, model=model, max_length=cfg.max_length)
    rows = tokenize_rows(read_rows(cfg.data), collator)  # every row checked before training starts
    checkpoints = os.path.join(cfg.out, "checkpoints")
    resume_from = newest_complete_checkpoint(checkpoints, log) if cfg.resume else None
    if cfg.resume and resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {checkpoints} that is complete (train without --resume "
                                "first)")
    if resume_from is not None:
        log(f"resuming from {resume_from}")
    model.config.ar_loss_weight = float(cfg.ar_weight)
    model.train()
    if cfg.lora:
        model = lora_model(model, cfg.lora_rank)
    log(f"{len(rows)} rows, {token_count(rows)} tokens; canvas {collator.canvas_length}; "
        f"{'LoRA rank ' + str(cfg.lora_rank) if cfg.lora else 'full fine-tuning'}, lr {cfg.learning_rate}")
    args = TrainingArguments(
        output_dir=checkpoints, num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=2,
        logging_steps=10, report_to=[], seed=cfg.seed, use_cpu=cfg.device == "cpu", bf16=cfg.bf16,
        disable_tqdm=cfg.quiet, dataloader_drop_last=False,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    result = trainer.train(resume_from_checkpoint=resume_from)
    check_finite_weights(model, "after training")  # never write a NaN model over OUT
    os.makedirs(cfg.out, exist_ok=True)
    if cfg.lora:
        model.save_pretrained(os.path.join(cfg.out, "adapter"))
        model = model.merge_and_unload()  # a plain checkpoint: generate and serve load it like any other
    model.save_pretrained(cfg.out)
    tokenizer.save_pretrained(cfg.out)
    return {"out": cfg.out, "steps": result.global_step, "train_loss": result.training_loss, "rows": len(rows),
            "tokens": token_count(rows)}
