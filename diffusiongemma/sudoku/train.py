"""Training recipe for the Sudoku demo model: `diffusiongemma train sudoku --out DIR`.

A tiny DiffusionGemma (same architecture, small sizes, the 15-token Sudoku vocabulary) learns to write a puzzle's
solution as one canvas: prompt = <bos> + 81 cells + '|', canvas = 81 solution digits + <eos>. The loss is
`diffusiongemma.training.block_diffusion_loss`.

Data: a pool of uniquely solvable puzzles is generated once (slow: a uniqueness check per blanked cell), then every
batch draws from the pool and applies a random Sudoku symmetry (digit relabelling, row/column shuffles within bands
and stacks, band/stack shuffles, transposition), which keeps uniqueness and makes the data effectively endless.

Output folder: the model (safetensors + config), tokenizer, generation_config.json, `train_log.jsonl` (one line per
evaluation), and `checkpoint/` (model, optimizer, scheduler, RNG states, step) for `--resume`.

Legend: B batch, P prompt length (83), L canvas length (82).
"""

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..generation.config import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig
from ..modeling import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from ..training.freeze import freeze_router
from ..training.loss import block_diffusion_loss
from .puzzles import make_puzzle
from .solver import solve_puzzles, solve_rate
from .tokenizer import encode_puzzle, sudoku_tokenizer

CANVAS_LENGTH = 82  # 81 digits + <eos>
TINY_VISION = dict(
    model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, head_dim=8,
)  # the architecture always carries a vision tower; Sudoku never uses it


@dataclass
class SudokuTrainConfig:
    """Settings of one training run (saved into the checkpoint for the record; `--resume` takes the model from it).

    Attributes:
        out: output folder.
        steps: optimizer steps in total.
        batch_size: puzzles per step.
        givens: evaluation difficulty; training puzzles have givens..givens+givens_spread givens.
        lr: peak AdamW learning rate (linear warmup, then cosine to 10%).
        eval_every: steps between evaluations and checkpoints.
        eval_puzzles: held-out puzzles per evaluation.
        seed: seeds the model init, the puzzle pool and the training draws.
        pool_size: uniquely solvable puzzles generated up front.
        hidden_size, num_layers, num_experts: model size.
        ar_weight: weight of the autoregressive prefix loss.
        freeze_router: keep the MoE routers at their initialization.
    """

    out: str
    steps: int = 2000
    batch_size: int = 64
    givens: int = 36
    givens_spread: int = 8
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    eval_every: int = 200
    eval_puzzles: int = 64
    seed: int = 0
    pool_size: int = 4000
    hidden_size: int = 128
    num_layers: int = 4
    num_experts: int = 4
    ar_weight: float = 1.0
    freeze_router: bool = False


def sudoku_model_config(hidden_size: int = 128, num_layers: int = 4, num_experts: int = 4) -> DiffusionGemmaConfig:
    """A tiny DiffusionGemma config for the Sudoku vocabulary (15 tokens) and an 82-token canvas.

    The window (256) covers prompt + canvas, so sliding layers see everything; the last layer is full attention.
    """
    heads = 4
    head_dim = hidden_size // heads
    text = dict(
        vocab_size=15, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, global_head_dim=head_dim,
        num_global_key_value_heads=2, num_experts=num_experts, top_k_experts=2, moe_intermediate_size=hidden_size,
        sliding_window=256, max_position_embeddings=512, final_logit_softcapping=30.0,
        layer_types=["sliding_attention"] * (num_layers - 1) + ["full_attention"],
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    return DiffusionGemmaConfig(text_config=text, vision_config=dict(TINY_VISION), canvas_length=CANVAS_LENGTH)


def sudoku_generation_config(**overrides) -> DiffusionGemmaGenerationConfig:
    """Generation settings of the demo model (tuned on held-out puzzles; see docs/training.md)."""
    fields = dict(
        max_new_tokens=CANVAS_LENGTH, max_denoising_steps=48, t_min=0.4, t_max=0.8, stability_threshold=1,
        confidence_threshold=0.005, sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1),
        eos_token_id=1, pad_token_id=0, bos_token_id=2, return_dict_in_generate=True,
    )
    fields.update(overrides)
    return DiffusionGemmaGenerationConfig(**fields)


# ---------------------------------------------------------------------------------------------------------------
# Data


def random_symmetry(rng: random.Random) -> tuple[list[int], str]:
    """A random validity-preserving Sudoku transform: (cell permutation [81], digit relabelling of '123456789')."""

    def shuffled_lines() -> list[int]:  # shuffle the 3 bands, and the 3 lines inside each band
        bands = rng.sample(range(3), 3)
        return [3 * b + i for b in bands for i in rng.sample(range(3), 3)]

    rows, cols = shuffled_lines(), shuffled_lines()
    transpose = rng.random() < 0.5
    cells = [(9 * rows[c] + cols[r]) if transpose else (9 * rows[r] + cols[c]) for r in range(9) for c in range(9)]
    return cells, "".join(rng.sample("123456789", 9))


def apply_symmetry(grid: str, cells: list[int], digits: str) -> str:
    """Move cell cells[i] to cell i and relabel digit d as digits[d-1]; blanks stay blanks."""
    return "".join(digits[int(grid[j]) - 1] if grid[j].isdigit() else grid[j] for j in cells)


def make_pool(rng: random.Random, size: int, givens: int, spread: int) -> list[tuple[str, str]]:
    """`size` uniquely solvable (puzzle, solution) pairs with givens..givens+spread givens."""
    return [make_puzzle(rng, rng.randint(givens, min(givens + spread, 80))) for _ in range(size)]


def make_batch(pairs: list[tuple[str, str]], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(puzzle, solution) pairs -> input_ids [B, P] and labels [B, L] (solution digits, then <eos>)."""
    input_ids = [encode_puzzle(tokenizer, p) for p, _ in pairs]
    labels = [tokenizer.encode(s, add_special_tokens=False) + [tokenizer.eos_token_id] for _, s in pairs]
    return torch.tensor(input_ids), torch.tensor(labels)


def draw_pairs(rng: random.Random, pool: list[tuple[str, str]], count: int) -> list[tuple[str, str]]:
    pairs = []
    for puzzle, solution in rng.choices(pool, k=count):
        cells, digits = random_symmetry(rng)
        pairs.append((apply_symmetry(puzzle, cells, digits), apply_symmetry(solution, cells, digits)))
    return pairs


# ---------------------------------------------------------------------------------------------------------------
# Schedule, checkpoints, evaluation


def warmup_cosine(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """LR multiplier: linear warmup to 1, then cosine down to `floor` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def save_checkpoint(folder: Path, model, optimizer, scheduler, step: int, rng: random.Random, cfg) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    state = {
        "step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "python_rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "config": asdict(cfg),
    }
    torch.save(state, folder / "trainer_state.pt")


def export_model(out: Path, model, tokenizer, generation_config) -> None:
    """Write the final folder: safetensors + config, tokenizer, generation_config.json."""
    model.generation_config = generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def held_out_puzzles(seed: int, count: int, givens: int) -> list[str]:
    """Evaluation puzzles from their own seed, disjoint in practice from the training pool."""
    rng = random.Random(f"sudoku-eval-{seed}")
    return [make_puzzle(rng, givens)[0] for _ in range(count)]


def evaluate(model, tokenizer, puzzles: list[str], batch_size: int = 64) -> dict:
    """Solve rate and steps of `model.generate` on `puzzles` (eval mode, no grad)."""
    was_training = model.training
    model.eval()
    results = []
    for i in range(0, len(puzzles), batch_size):
        results += solve_puzzles(model, tokenizer, puzzles[i : i + batch_size])
    model.train(was_training)
    return solve_rate(results)


# ---------------------------------------------------------------------------------------------------------------
# The loop


def train_sudoku(cfg: SudokuTrainConfig, resume: bool = False, log=print) -> dict:
    """Train (or resume) the Sudoku model and export it into `cfg.out`.

    Returns:
        the last evaluation (solve_rate, mean_steps, median_steps, count, step).
    """
    out = Path(cfg.out)
    ckpt = out / "checkpoint"
    torch.manual_seed(cfg.seed)
    tokenizer = sudoku_tokenizer()
    generation_config = sudoku_generation_config()
    state = None
    if resume:
        if not (ckpt / "trainer_state.pt").exists():
            raise FileNotFoundError(f"--resume: no checkpoint in {ckpt}")
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(ckpt)
    else:
        model = DiffusionGemmaForBlockDiffusion(sudoku_model_config(cfg.hidden_size, cfg.num_layers, cfg.num_experts))
    model.generation_config = generation_config
    model.train()
    if cfg.freeze_router:
        freeze_router(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, cfg.warmup, cfg.steps))
    rng = random.Random(cfg.seed)
    start = 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        rng.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        start = state["step"]

    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; building a pool of "
        f"{cfg.pool_size} puzzles ({cfg.givens}..{cfg.givens + cfg.givens_spread} givens)")
    pool = make_pool(random.Random(f"sudoku-pool-{cfg.seed}"), cfg.pool_size, cfg.givens, cfg.givens_spread)
    eval_set = held_out_puzzles(cfg.seed, cfg.eval_puzzles, cfg.givens)
    out.mkdir(parents=True, exist_ok=True)
    last = {}
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="train sudoku", dynamic_ncols=True)
    started = time.time()
    for step in bar:
        input_ids, labels = make_batch(draw_pairs(rng, pool, cfg.batch_size), tokenizer)
        result = block_diffusion_loss(model, input_ids=input_ids, labels=labels, ar_weight=cfg.ar_weight)
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        bar.set_postfix(diff=f"{result.diffusion_loss.item():.3f}", ar=f"{result.ar_loss.item():.3f}"
                        if result.ar_loss is not None else "-", lr=f"{scheduler.get_last_lr()[0]:.1e}")
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            last = {"step": done, "diffusion_loss": result.diffusion_loss.item(),
                    "elapsed_s": round(time.time() - started, 1), **evaluate(model, tokenizer, eval_set)}
            log(json.dumps(last))
            with open(out / "train_log.jsonl", "a") as f:
                f.write(json.dumps(last) + "\n")
            save_checkpoint(ckpt, model, optimizer, scheduler, done, rng, cfg)
            export_model(out, model, tokenizer, generation_config)
    return last
