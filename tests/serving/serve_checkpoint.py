"""The tiny served checkpoint shared by the serving tests (a folder, as `diffusiongemma serve --model` takes)."""

import torch

from conftest import tiny_model, tiny_tokenizer, write_generation_config

STEPS = 6  # denoising steps per canvas by default: small, so every request is quick


def write_checkpoint(path) -> str:
    """A tiny model with sharp logits (rows converge after different numbers of steps), its tokenizer, and a
    generation config with EOS 1 and pad 0."""
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    write_generation_config(path, eos_token_id=1, pad_token_id=0, max_new_tokens=32, max_denoising_steps=STEPS,
                            stability_threshold=0, confidence_threshold=0.8)
    return str(path)
