"""bitsandbytes (LLM.int8 and 4-bit NF4/FP4) through transformers' own HfQuantizer, with DiffusionGemma defaults.

bitsandbytes replaces `nn.Linear` modules only. In DiffusionGemma that means the attention projections
(`q/k/v/o_proj`) and the dense MLP (`mlp.gate/up/down_proj`) of every layer. The routed experts are fused 3-D
parameters (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), not Linears, so they stay in the
load dtype: on the 26B model that is ~87% of the weights, so bitsandbytes saves far less memory here than on a dense
model (use the FP8 / NVFP4 compressed-tensors checkpoints for that). By default we also keep in full precision what
the compressed-tensors releases keep: lm_head (tied to the embeddings), the routers (a flipped top-k changes which
experts run), self-conditioning, the vision tower and its projector.

Hardware: bitsandbytes >= 0.45 has CPU kernels for 8-bit and 4-bit; the 4-bit CPU path needs every quantized
in_features to be a multiple of the block size (64). CUDA is needed for the fast kernels and for 8-bit outlier
(LLM.int8 threshold) decomposition at speed.
"""

import copy

from transformers import BitsAndBytesConfig

DEFAULT_SKIP_MODULES = ["lm_head", r".*\.router", r".*\.self_conditioning", r".*\.vision_tower", r".*\.embed_vision"]


def with_diffusiongemma_defaults(config: BitsAndBytesConfig) -> BitsAndBytesConfig:
    """A copy of `config` with `llm_int8_skip_modules` set to `DEFAULT_SKIP_MODULES` when the user gave none (the
    user's object is never changed, so it can be reused for another model).

    transformers matches each entry as a regex from the start of a module name up to a module boundary, or as a
    suffix (for 8-bit and 4-bit alike).
    """
    if getattr(config, "llm_int8_skip_modules", None) is not None:
        return config
    config = copy.deepcopy(config)
    config.llm_int8_skip_modules = list(DEFAULT_SKIP_MODULES)
    return config
