"""Tiny builders for image-prompt tests: a vision config, the Gemma 4 image processor and processor, random images.

Nothing is downloaded. The processor is transformers' own `Gemma4Processor` around a tiny tokenizer holding the image
tokens and the PIL `Gemma4ImageProcessorPil` (patch 4, so an image is ~100 px and 70 soft tokens at most).
"""

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedTokenizerFast

from conftest import tiny_config, tiny_tokenizer

BOI, IMAGE, EOI = 124, 125, 126  # token ids inside the tiny 128-token vocabulary
MEDIA_TOKENS = {"boi_token": "<x124>", "image_token": "<x125>", "eoi_token": "<x126>", "boa_token": "<x121>",
                "eoa_token": "<x122>", "audio_token": "<x123>"}
VISION_CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<x125>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<model>{% endif %}"
)


def tiny_vision_config(bidirectional: str | None = "vision", **overrides):
    """`tiny_config` with image token ids inside the vocabulary, a 4-pixel patch and the given overlay setting."""
    config = tiny_config(use_bidirectional_attention=bidirectional, **overrides)
    config.vision_config.patch_size = 4
    config.image_token_id, config.boi_token_id, config.eoi_token_id = IMAGE, BOI, EOI
    return config


def tiny_image_processor():
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    return Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70, pooling_kernel_size=3)


def tiny_media_tokenizer() -> PreTrainedTokenizerFast:
    """`conftest.tiny_tokenizer` whose filler tokens 121-126 are the Gemma 4 media tokens (image_token, boi_token, ...
    as special-token attributes)."""
    base = tiny_tokenizer()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        unk_token="<unk>", padding_side="left", extra_special_tokens=MEDIA_TOKENS,
    )
    fast.chat_template = base.chat_template
    return fast


def tiny_processor():
    """transformers' `Gemma4Processor` on the tiny tokenizer and image processor (video: see
    `diffusiongemma.processing`, which refuses videos)."""
    from diffusiongemma.processing import build_processor

    return build_processor(tiny_media_tokenizer(), tiny_image_processor(), image_seq_length=70,
                           chat_template=VISION_CHAT_TEMPLATE)


def random_image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def image_prompt(texts: list[str], images: list[list[Image.Image]], processor=None) -> dict:
    """The processor's tensors for prompts whose `<x125>` marks each image: input_ids [B, P] (left-padded),
    attention_mask, pixel_values [I, M, 48], image_position_ids [I, M, 2], mm_token_type_ids [B, P]."""
    processor = processor or tiny_processor()
    kwargs = {"images": images} if any(images) else {}
    out = processor(text=texts, return_tensors="pt", **kwargs)
    out = {k: v for k, v in out.items() if isinstance(v, torch.Tensor) and k != "num_soft_tokens_per_image"}
    return out
