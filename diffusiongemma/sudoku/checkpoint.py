"""Resumable checkpoints of the Sudoku recipe: weights, optimizer, RNG states and step, loadable with weights_only.

A checkpoint folder holds the model (`save_pretrained`: config.json + fp32 model.safetensors) and
`trainer_state.pt`, a dict of tensors and plain Python values only (no pickled objects), so it loads with
`torch.load(..., weights_only=True)`:

    step               int, optimizer steps done
    optimizer          AdamW state_dict
    python_rng         random.Random.getstate() (a tuple of ints): the data draws
    loss_rng           torch.Generator state (uint8 tensor): every draw of the training loss
    loss_rng_device    the device type of that generator ('cpu', 'cuda'): states do not transfer between types
    torch_rng          torch global RNG state (uint8 tensor)
    config             the run's settings (SudokuTrainConfig as a dict)
    elapsed_s          training seconds over all sessions
    puzzles_seen       training puzzles over all sessions

The folder is replaced atomically (`diffusiongemma.io.atomic`: written next to it, then swapped into place), so an
interrupted save never leaves a half-written checkpoint behind.
"""

import random
from pathlib import Path

import torch

from ..io.atomic import atomic_folder
from ..model import DiffusionGemmaForBlockDiffusion

STATE_FILE = "trainer_state.pt"


def save_checkpoint(folder: Path, model, optimizer, step: int, rng: random.Random, loss_rng: torch.Generator,
                    config: dict, elapsed_s: float, puzzles_seen: int) -> None:
    """Write a resumable checkpoint into `folder`: the model and the trainer state as one unit, through the package's
    atomic writer (an interrupted save leaves the previous checkpoint whole)."""
    state = {
        "step": step, "optimizer": optimizer.state_dict(), "python_rng": rng.getstate(),
        "loss_rng": loss_rng.get_state(), "loss_rng_device": loss_rng.device.type,
        "torch_rng": torch.get_rng_state(), "config": dict(config),
        "elapsed_s": float(elapsed_s), "puzzles_seen": int(puzzles_seen),
    }
    with atomic_folder(folder, overwrite=True) as work:
        model.save_pretrained(work)
        torch.save(state, work / STATE_FILE)


def load_trainer_state(folder: Path) -> dict:
    """The `trainer_state.pt` dict of a checkpoint folder (weights_only: no code runs while loading)."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"--resume: no checkpoint in {folder} (expected {STATE_FILE}); train without "
                                "--resume first")
    return torch.load(path, weights_only=True, map_location="cpu")


def load_checkpoint_model(folder: Path) -> DiffusionGemmaForBlockDiffusion:
    """The checkpoint's model in fp32, train mode."""
    return DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=torch.float32).train()


def restore_rngs(state: dict, rng: random.Random, loss_rng: torch.Generator, log=print) -> None:
    """Put the data, loss and global RNGs back where the checkpoint left them.

    A loss generator saved on another device type (e.g. a GPU burst resumed on CPU) cannot take the saved state:
    it is reseeded from (seed, step) instead, and the run continues without being bit-identical.
    """
    version, internal, gauss = state["python_rng"]
    rng.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch_rng"])
    saved_device = state.get("loss_rng_device", "cpu")
    if saved_device == loss_rng.device.type:
        loss_rng.set_state(state["loss_rng"])
        return
    loss_rng.manual_seed(int(state["config"].get("seed", 0)) * 1_000_003 + int(state["step"]))
    log(f"the checkpoint's loss generator ran on {saved_device}, this run on {loss_rng.device.type}: reseeded it, "
        "so this resume is not bit-identical to an uninterrupted run")
