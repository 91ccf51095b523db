"""Training checkpoints that are whole or absent, and runs that stop on a non-finite loss (`train sft`).

`SFTTrainer` is transformers' `Trainer` with two changes:

* **Atomic checkpoints.** Trainer writes `checkpoint-N` file by file; Ctrl-C in the middle leaves a folder without
  its optimizer or trainer state, and resuming from it fails. Here Trainer writes into a hidden staging folder
  (`OUT/checkpoints/.saving-*`), and the finished checkpoint is swapped into place by `io.atomic_folder`. An
  interruption leaves the previous checkpoints as they were; old checkpoints are rotated only after the swap.
* **Non-finite loss.** Each training step's loss is checked; a NaN or Inf loss stops the run with
  `NonFiniteLossError`, naming the step. Before every checkpoint the trainable weights are checked too, so no NaN
  model is ever saved over a good one.

`newest_complete_checkpoint` picks what `--resume` continues from: the newest `checkpoint-N` that holds its trainer
state, weights and optimizer state, naming every newer folder it skips.
"""

import json
import os
import shutil
import tempfile

import torch
from transformers import Trainer
from transformers.trainer_utils import rotate_checkpoints

from ..io.atomic import atomic_folder

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or Inf loss (or weights); the run stops before saving anything from it."""


def non_finite_parameters(model: torch.nn.Module, limit: int = 5) -> list[str]:
    """Names of trainable parameters holding NaN or Inf (at most `limit`)."""
    bad = []
    for name, p in model.named_parameters():
        if p.requires_grad and p.is_floating_point() and not bool(torch.isfinite(p.detach()).all()):
            bad.append(name)
            if len(bad) == limit:
                break
    return bad


def check_finite_weights(model: torch.nn.Module, when: str) -> None:
    """NonFiniteLossError naming the parameters if any trainable weight is NaN or Inf."""
    bad = non_finite_parameters(model)
    if bad:
        raise NonFiniteLossError(f"{when}: trainable weights hold NaN or Inf ({bad}); nothing was saved from this "
                                 "run after its last good checkpoint (lower --lr)")


def incomplete_reason(folder: str) -> str | None:
    """Why `folder` is not a checkpoint `--resume` can continue from, or None when it is whole."""
    state = os.path.join(folder, "trainer_state.json")
    try:
        with open(state) as f:
            json.load(f)
    except (OSError, ValueError):
        return "no readable trainer_state.json"
    if not any(os.path.isfile(os.path.join(folder, name)) for name in WEIGHT_FILES):
        return "no weights"
    if not os.path.isfile(os.path.join(folder, "optimizer.pt")):
        return "no optimizer.pt"
    return None


def newest_complete_checkpoint(folder: str, log=print) -> str | None:
    """The newest whole `checkpoint-N` in `folder` (None if there is none); each newer incomplete one is named in
    `log`."""
    if not os.path.isdir(folder):
        return None
    steps = sorted((d for d in os.listdir(folder) if d.startswith("checkpoint-") and d.split("-")[-1].isdigit()),
                   key=lambda d: int(d.split("-")[-1]), reverse=True)
    for name in steps:
        reason = incomplete_reason(os.path.join(folder, name))
        if reason is None:
            return os.path.join(folder, name)
        log(f"--resume: skipping {os.path.join(folder, name)}, which is incomplete ({reason})")
    return None


class SFTTrainer(Trainer):
    """`Trainer` whose checkpoints are atomic and whose run stops on a non-finite loss (see the module docstring)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not bool(torch.isfinite(loss)):
            raise NonFiniteLossError(
                f"the training loss is {float(loss)} at step {self.state.global_step + 1}; stopping, and nothing from "
                "this run is saved after its last good checkpoint (lower --lr, check --ar-weight and the data)")
        return loss

    def _save_checkpoint(self, model, trial) -> None:
        check_finite_weights(model, f"checkpoint at step {self.state.global_step}")
        run_dir = self._get_output_dir(trial=trial)
        os.makedirs(run_dir, exist_ok=True)
        final = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        staging = tempfile.mkdtemp(prefix=".saving-", dir=run_dir)
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # rotate after the swap, not inside
        self._get_output_dir = lambda trial=None: staging
        try:
            super()._save_checkpoint(model, trial)
            written = os.path.join(staging, os.path.basename(final))
            with atomic_folder(final, overwrite=True) as work:
                for name in os.listdir(written):
                    os.replace(os.path.join(written, name), os.path.join(work, name))
        finally:
            del self._get_output_dir  # the class's method again
            self.args.save_total_limit = limit
            shutil.rmtree(staging, ignore_errors=True)
        rotate_checkpoints(output_dir=run_dir, save_total_limit=limit,
                           best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
