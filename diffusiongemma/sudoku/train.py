"""Training recipe for the Sudoku demo model: `diffusiongemma train sudoku --out DIR`.

A tiny DiffusionGemma (same architecture, small sizes, the 15-token Sudoku vocabulary) learns to write a puzzle's
solution as one canvas: prompt = <bos> + 81 cells + '|', canvas = 81 solution digits + <eos>. The loss is
`diffusiongemma.training.block_diffusion_loss`; the data (pool, revealed cells, symmetries, curriculum) lives in
`sudoku/data.py`, the resumable checkpoint in `sudoku/checkpoint.py`.

Output folder: the model (safetensors + config), tokenizer, generation_config.json, `train_log.jsonl` (one line per
evaluation), the cached puzzle pool, and `checkpoint/` for `--resume`, which continues bit for bit: same data
order, same loss draws, same optimizer state (the learning rate is a pure function of the step). Evaluation runs
under a forked RNG, so how often it runs does not change training. Ctrl-C finishes the current step, saves a
checkpoint and returns.

Legend: B batch, P prompt length (83), L canvas length (82).
"""

import json
import math
import random
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..generation.config import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig
from ..model import DiffusionGemmaForBlockDiffusion
from ..modeling import DiffusionGemmaConfig
from ..training.freeze import freeze_router
from ..training.loss import block_diffusion_loss
from . import data
from .checkpoint import load_checkpoint_model, load_trainer_state, restore_rngs, save_checkpoint
from .solver import solve_puzzles, solve_rate
from .tokenizer import sudoku_tokenizer

CANVAS_LENGTH = 82  # 81 digits + <eos>
EVAL_SEED = 1234  # generation draws during evaluation (under a forked RNG)
TINY_VISION = dict(
    model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, head_dim=8,
)  # the architecture always carries a vision tower; Sudoku never uses it


@dataclass
class SudokuTrainConfig:
    """Settings of one training run (saved in the checkpoint; `--resume` reuses them, explicit options override).

    Attributes:
        out: output folder.
        steps: optimizer steps in total (the cosine schedule ends there).
        batch_size: puzzles per step.
        givens: target difficulty; the first of the evaluation levels.
        eval_givens: further givens counts evaluated at every evaluation (learning curve per difficulty).
        givens_min: fewest givens of training puzzles once the curriculum is over (default: `givens`); the pool is
            generated at this count.
        givens_spread: training puzzles get U{low..low+spread} givens (revealed from the pool's solutions).
        givens_start: curriculum start: `low` moves linearly from here to `givens_min` over `curriculum_steps`.
        curriculum_steps: length of the curriculum (0: none).
        lr: peak AdamW learning rate (linear warmup, then cosine to `lr_floor` of it at `steps`).
        eval_every: steps between evaluations and checkpoints.
        eval_puzzles: held-out puzzles per evaluated givens count.
        seed: seeds the model init, the puzzle pool, the data draws and the loss draws.
        pool_size: uniquely solvable puzzles generated up front (cached in `out`).
        hidden_size, num_layers, num_experts: model size (ignored with `init_from`).
        positions: RoPE layout of a fresh model: "base3" (periods 3, 9, 27, 81...: the grid's column, row-in-band and
            cell structure are single rotary frequencies; see `sudoku_rope`) or "default" (Gemma's frequencies, which
            learn Sudoku several times slower).
        ar_weight: weight of the autoregressive prefix loss.
        freeze_router: keep the MoE routers at their initialization.
        init_from: start from the weights of this model folder (fresh optimizer) instead of a random init.
    """

    out: str
    steps: int = 2000
    batch_size: int = 64
    givens: int = 36
    eval_givens: list[int] = field(default_factory=list)
    givens_min: int | None = None
    givens_spread: int = 8
    givens_start: int | None = None
    curriculum_steps: int = 0
    lr: float = 1e-3
    lr_floor: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    eval_every: int = 200
    eval_puzzles: int = 64
    seed: int = 0
    pool_size: int = 4000
    hidden_size: int = 128
    num_layers: int = 4
    num_experts: int = 4
    positions: str = "base3"
    ar_weight: float = 1.0
    freeze_router: bool = False
    init_from: str | None = None

    def training_givens(self, step: int) -> tuple[int, int]:
        """(low, high) givens of the puzzles drawn at `step`."""
        end = self.givens_min if self.givens_min is not None else self.givens
        start = self.givens_start if self.givens_start is not None else end
        low = data.curriculum_givens(step, start, end, self.curriculum_steps)
        return low, min(80, low + self.givens_spread)


def config_from_dict(values: dict) -> SudokuTrainConfig:
    """A config from a checkpoint's dict (unknown keys from other versions are dropped)."""
    known = {f.name for f in fields(SudokuTrainConfig)}
    return SudokuTrainConfig(**{k: v for k, v in values.items() if k in known})


POSITION_LAYOUTS = ("default", "base3")


def sudoku_rope(positions: str, head_dim: int) -> dict:
    """Per-layer-type RoPE parameters of the Sudoku model.

    "default": Gemma's (theta 1e4 on sliding layers; proportional, theta 1e6, a quarter rotated on the full layer).
    "base3": "proportional" RoPE whose rotated frequencies are 2*pi/3, 2*pi/9, 2*pi/27, ... (theta = 3**(D/2) makes
    each frequency a third of the one before, factor 3/(2*pi) sets the first). Cell (r, c) of a grid written row by
    row sits at 9r + c + offset, so "same column" is one phase of the period-9 frequency, "same cell of the puzzle and
    of the solution" one phase of the period-81 frequency, and so on: relations the default frequencies (period
    2*pi, 11.2, 19.9, ...) can only approximate. Half the dims rotate on sliding layers, a quarter on the full one;
    the rest carry content only.
    """
    if positions == "default":
        return {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.25},
        }
    if positions == "base3":
        theta, factor = float(3 ** (head_dim // 2)), 3 / (2 * math.pi)
        return {
            kind: {"rope_type": "proportional", "rope_theta": theta, "factor": factor, "partial_rotary_factor": share}
            for kind, share in (("sliding_attention", 0.5), ("full_attention", 0.25))
        }
    raise ValueError(f"positions must be one of {POSITION_LAYOUTS}, got {positions!r}")


def sudoku_model_config(hidden_size: int = 128, num_layers: int = 4, num_experts: int = 4,
                        positions: str = "base3") -> DiffusionGemmaConfig:
    """A tiny DiffusionGemma config for the Sudoku vocabulary (15 tokens) and an 82-token canvas.

    The window (256) covers prompt + canvas, so sliding layers see everything; the last layer is full attention.
    `positions` picks the RoPE layout (`sudoku_rope`).
    """
    heads = 4
    head_dim = hidden_size // heads
    text = dict(
        vocab_size=15, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, global_head_dim=head_dim,
        num_global_key_value_heads=2, num_experts=num_experts, top_k_experts=2, moe_intermediate_size=hidden_size,
        sliding_window=256, max_position_embeddings=512, final_logit_softcapping=30.0,
        layer_types=["sliding_attention"] * (num_layers - 1) + ["full_attention"],
        pad_token_id=0, eos_token_id=1, bos_token_id=2, rope_parameters=sudoku_rope(positions, head_dim),
    )
    return DiffusionGemmaConfig(text_config=text, vision_config=dict(TINY_VISION), canvas_length=CANVAS_LENGTH)


def sudoku_generation_config(**overrides) -> DiffusionGemmaGenerationConfig:
    """Generation settings of the demo model, tuned on held-out puzzles (seeds 1 and 2, never the headline seed 0):
    sampling temperature 1.2 falling to 0.8 keeps re-noised cells exploring (36 givens: 78% -> 88% solved versus
    0.8 -> 0.4), a 32-step cap ends hopeless runs early (mean steps 12.9 -> 9.1), and a mean-entropy threshold of
    0.02 stops solved canvases sooner at the same solve rate (36 givens 9.1 -> 7.9 steps, 65 givens 8.3 -> 2.2).
    See docs/training.md."""
    fields_ = dict(
        max_new_tokens=CANVAS_LENGTH, max_denoising_steps=32, t_min=0.8, t_max=1.2, stability_threshold=1,
        confidence_threshold=0.02, sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1),
        eos_token_id=1, pad_token_id=0, bos_token_id=2, return_dict_in_generate=True,
    )
    fields_.update(overrides)
    return DiffusionGemmaGenerationConfig(**fields_)


def warmup_cosine(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """LR multiplier: linear warmup to 1, then cosine down to `floor` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def export_model(out: Path, model, tokenizer, generation_config) -> None:
    """Write the final folder: safetensors + config, tokenizer, generation_config.json."""
    model.generation_config = generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def evaluate(model, tokenizer, puzzles: list[str], batch_size: int = 64) -> dict:
    """Solve rate and steps of `model.generate` on `puzzles` (eval mode, no grad, global RNGs left untouched)."""
    was_training = model.training
    model.eval()
    results = []
    cuda = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(EVAL_SEED)
        for i in range(0, len(puzzles), batch_size):
            results += solve_puzzles(model, tokenizer, puzzles[i : i + batch_size])
    model.train(was_training)
    return solve_rate(results)


class StopOnInterrupt:
    """Context manager: the first Ctrl-C sets `requested` (the loop saves and stops after the step); the second
    one interrupts at once. Only installed in the main thread."""

    def __init__(self):
        self.requested = False
        self.previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def build_model(cfg: SudokuTrainConfig, log) -> DiffusionGemmaForBlockDiffusion:
    """A fresh model (seeded init), or the weights of `cfg.init_from` in fp32."""
    if cfg.init_from:
        log(f"starting from the weights in {cfg.init_from} (fresh optimizer)")
        return DiffusionGemmaForBlockDiffusion.from_pretrained(cfg.init_from, dtype=torch.float32)
    torch.manual_seed(cfg.seed)
    return DiffusionGemmaForBlockDiffusion(sudoku_model_config(cfg.hidden_size, cfg.num_layers, cfg.num_experts,
                                                                cfg.positions))


def _print_now(message: str) -> None:
    print(message, flush=True)


def train_sudoku(cfg: SudokuTrainConfig, resume: bool = False, log=_print_now, device: str = "cpu") -> dict:
    """Train (or resume) the Sudoku model on `device` and export it into `cfg.out`.

    Returns:
        the last evaluation (step, losses, `eval_<givens>` solve rates and steps, ...); if Ctrl-C stopped the run
        early, `{"step", "interrupted": True, "last_evaluation"}` instead.
    """
    out = Path(cfg.out)
    ckpt = out / "checkpoint"
    tokenizer = sudoku_tokenizer()
    generation_config = sudoku_generation_config()
    state = load_trainer_state(ckpt) if resume else None
    model = load_checkpoint_model(ckpt) if resume else build_model(cfg, log)
    model.generation_config = generation_config
    model.to(device).train()
    if cfg.freeze_router:
        freeze_router(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    rng = random.Random(cfg.seed)  # data draws
    loss_rng = torch.Generator(device).manual_seed(cfg.seed)  # every draw of the loss
    start, elapsed, seen = 0, 0.0, 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        restore_rngs(state, rng, loss_rng, log=log)
        start, elapsed, seen = state["step"], state["elapsed_s"], state["puzzles_seen"]

    low, high = cfg.training_givens(start)
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters on {device}, "
        f"{torch.get_num_threads()} threads; training givens {low}..{high} at step {start}")
    pool_givens = cfg.givens_min if cfg.givens_min is not None else cfg.givens
    pool = data.load_or_make_pool(out, cfg.seed, cfg.pool_size, pool_givens, log=log)
    eval_levels = [cfg.givens] + [g for g in cfg.eval_givens if g != cfg.givens]
    eval_sets = {g: data.held_out_puzzles(cfg.seed, cfg.eval_puzzles, g) for g in eval_levels}
    out.mkdir(parents=True, exist_ok=True)

    def checkpoint(step: int) -> None:
        save_checkpoint(ckpt, model, optimizer, step, rng, loss_rng, asdict(cfg), elapsed, seen)

    last = {"step": start}
    interactive = sys.stderr.isatty()
    bar = tqdm(total=cfg.steps, initial=start, desc="train sudoku", dynamic_ncols=True,
               mininterval=1 if interactive else 60, file=sys.stderr)
    losses = []
    session_start, session_seen = time.time(), 0
    step = start
    with StopOnInterrupt() as stop:
        while step < cfg.steps:
            tick = time.time()
            low, high = cfg.training_givens(step)
            input_ids, labels = data.make_batch(data.draw_pairs(rng, pool, cfg.batch_size, low, high), tokenizer)
            input_ids, labels = input_ids.to(device), labels.to(device)
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * warmup_cosine(step, cfg.warmup, cfg.steps, cfg.lr_floor)
            result = block_diffusion_loss(model, input_ids=input_ids, labels=labels, generator=loss_rng,
                                          ar_weight=cfg.ar_weight)
            optimizer.zero_grad(set_to_none=True)
            result.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
            seen += cfg.batch_size
            session_seen += cfg.batch_size
            elapsed += time.time() - tick
            losses.append(result.diffusion_loss.item())
            rate = session_seen / max(1e-9, time.time() - session_start)
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", puzzles_s=f"{rate:.1f}", givens=f"{low}-{high}",
                            lr=f"{optimizer.param_groups[0]['lr']:.1e}", refresh=False)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                last = {"step": step, "diffusion_loss": round(sum(losses) / len(losses), 4),
                        "givens_range": [low, high], "lr": optimizer.param_groups[0]["lr"],
                        "elapsed_s": round(elapsed, 1), "puzzles_seen": seen, "puzzles_per_s": round(rate, 2),
                        **{f"eval_{g}": evaluate(model, tokenizer, puzzles) for g, puzzles in eval_sets.items()}}
                losses = []
                bar.write(f"step {step}: loss {last['diffusion_loss']:.3f}; solved " + ", ".join(
                    f"{last[f'eval_{g}']['solve_rate']:.0%} at {g} givens in {last[f'eval_{g}']['mean_steps']:.1f} "
                    "steps" for g in eval_sets), file=sys.stderr)
                with open(out / "train_log.jsonl", "a") as f:
                    f.write(json.dumps(last) + "\n")
                checkpoint(step)
                export_model(out, model, tokenizer, generation_config)
            if stop.requested:
                checkpoint(step)
                export_model(out, model, tokenizer, generation_config)
                log(f"interrupted: checkpoint saved at step {step}; continue with --resume")
                last = {"step": step, "interrupted": True, "last_evaluation": last}
                break
    bar.close()
    return last
