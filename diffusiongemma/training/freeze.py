"""Parameter freezing used by training recipes."""

from torch import nn

from ..modeling.moe import Router


def freeze_router(model: nn.Module) -> list[str]:
    """Stop training every MoE router (`router.proj`, `router.scale`, `router.per_expert_scale`).

    Keeping routing fixed avoids expert-load drift when fine-tuning a pretrained MoE on a small dataset.

    Returns:
        the names of the parameters that were frozen.
    """
    frozen = []
    for name, module in model.named_modules():
        if isinstance(module, Router):
            for pname, p in module.named_parameters():
                p.requires_grad_(False)
                frozen.append(f"{name}.{pname}")
    return frozen
