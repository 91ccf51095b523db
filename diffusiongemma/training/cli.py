"""`diffusiongemma train sft`: fine-tune a checkpoint on prompt-completion or chat rows (see training/sft.py).

Plugged into the `train` command by `add_sft_command(recipes)`; this module never imports the top-level cli.
"""

from ..cli_types import bounded_float, positive_int

_positive_float = bounded_float(0, low_open=True)  # inf and nan train a NaN model
_non_negative_float = bounded_float(0)


def add_sft_command(recipes) -> None:
    """Register `sft` on the `train` command's recipe subparsers."""
    t = recipes.add_parser(
        "sft",
        help="fine-tune a DiffusionGemma checkpoint on your data (full or LoRA), with transformers' Trainer",
        description="Supervised fine-tuning with the block-diffusion loss. --data is a JSON-lines file (one object "
        "per line: {\"prompt\", \"completion\"} or {\"messages\": [...]}) or a datasets folder (save_to_disk). "
        "Every row is checked first; a bad one stops the run naming its line. Responses longer than one canvas "
        "are trained canvas by canvas against their clean prefix, in one forward. Checkpoints go to "
        "OUT/checkpoints every --save-steps (resume with --resume); the final model (merged, with --lora; the "
        "adapter alone in OUT/adapter) and tokenizer to OUT.",
    )
    t.add_argument("--model", required=True, help="checkpoint folder to start from (with tokenizer files)")
    t.add_argument("--data", required=True, help="FILE.jsonl or a datasets folder")
    t.add_argument("--out", required=True, help="output folder")
    t.add_argument("--lora", action="store_true", help="train LoRA adapters (q/k/v/o, gate/up/down) instead of all "
                   "weights")
    t.add_argument("--lora-rank", type=positive_int, default=16, help="LoRA rank (default 16; alpha = 2 x rank)")
    t.add_argument("--epochs", type=_positive_float, default=1.0, help="passes over the data (default 1)")
    t.add_argument("--lr", type=_positive_float, default=None, help="peak learning rate (default 1e-4, LoRA 1e-3)")
    t.add_argument("--batch-size", type=positive_int, default=8, help="rows per step (default 8)")
    t.add_argument("--grad-accum", type=positive_int, default=1, help="gradient accumulation steps (default 1)")
    t.add_argument("--max-length", type=positive_int, default=None,
                   help="refuse rows with more prompt + response tokens (rows are never truncated)")
    t.add_argument("--ar-weight", type=_non_negative_float, default=1.0, help="weight of the AR loss on the prompt and earlier "
                   "canvases (default 1; 0: none)")
    t.add_argument("--save-steps", type=positive_int, default=200, help="steps between checkpoints (default 200)")
    t.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    t.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    t.add_argument("--bf16", action="store_true", help="bf16 autocast")
    t.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT/checkpoints")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=run_train_sft)


def run_train_sft(args) -> int:
    import sys

    import torch

    from ..io.tokenizer_files import folder_has_tokenizer
    from ..modeling.config import check_model_folder
    from .sft import SFTConfig, run_sft

    check_model_folder(args.model)
    if not folder_has_tokenizer(args.model):
        raise ValueError(f"--model {args.model} has no tokenizer files; fine-tuning reads the tokenizer from the "
                         "model folder (save the tokenizer there first)")
    if args.threads:
        torch.set_num_threads(args.threads)
    fields = {k: getattr(args, k) for k in ("model", "data", "out", "lora", "lora_rank", "epochs", "lr", "batch_size",
                                            "grad_accum", "max_length", "ar_weight", "save_steps", "seed", "device",
                                            "bf16", "resume", "quiet")}
    summary = run_sft(SFTConfig(**fields), log=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"done: {summary['steps']} steps, mean loss {summary['train_loss']:.4f}; model written to {summary['out']}",
          flush=True)
    return 0
