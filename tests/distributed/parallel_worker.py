"""One rank of the 2-process tests in test_parallel_torchrun.py; also run in the test process for the single-process
answer (`compute`). Usage under torchrun: `parallel_worker.py MODEL_DIR OUT_DIR MODE [MODE ...]`.

Every MODE loads MODEL_DIR with its `DistributedConfig` and saves this rank's answers to OUT_DIR/MODE.rankR.pt.
"""

import os
import sys

import torch

PROMPTS = [[2, 17, 33, 41, 9], [2, 64, 5]]  # two lengths: mixed batching strips the padding
SEEDS = [11, 12]


def distributed_config(mode: str):
    """The exact calls docs/distributed.md gives, for the pinned transformers."""
    from transformers import DistributedConfig

    world = int(os.environ["WORLD_SIZE"])
    return {
        "tp": lambda: DistributedConfig(tp_plan="auto"),  # tensor parallelism: the config's base_model_tp_plan
        "ep": lambda: DistributedConfig(ep_size=world, tp_plan={}),  # experts split, attention whole on every rank
        "tp_ep": lambda: DistributedConfig(tp_size=world, ep_size=world),  # attention by heads, experts by rank
        "ep_a2a": lambda: DistributedConfig(ep_size=world, tp_plan={}, ep_implementation="all_to_all"),
    }[mode]()


@torch.no_grad()
def compute(model) -> dict:
    """Logits of one forward without and with self-conditioning, and generated tokens (fast with per-request seeds;
    reference with the global RNG)."""
    prompt = torch.tensor([PROMPTS[0]])
    canvas = (torch.arange(model.canvas_length)[None] * 7) % model.config.text_config.vocab_size
    first = model(input_ids=prompt, decoder_input_ids=canvas).logits  # [1, L, V] fp32
    second = model(input_ids=prompt, decoder_input_ids=canvas, self_conditioning_logits=first).logits
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])  # left padding
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in PROMPTS])[:, None]).long()
    fast = model.generate(ids, attention_mask=mask, sampling="fast", seed=SEEDS, max_new_tokens=32,
                          max_denoising_steps=6)
    torch.manual_seed(0)
    reference = model.generate(prompt, max_new_tokens=32, max_denoising_steps=6)
    return {"logits": first, "sc_logits": second, "fast": fast.sequences, "reference": reference.sequences}


def main(model_dir: str, out_dir: str, modes: list[str]) -> None:
    from diffusiongemma import DiffusionGemmaForBlockDiffusion

    rank = int(os.environ["RANK"])
    for mode in modes:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir, distributed_config=distributed_config(mode))
        placements = {n: str(getattr(p, "placements", "")) for n, p in model.named_parameters()}
        torch.save({**compute(model), "placements": placements}, os.path.join(out_dir, f"{mode}.rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
