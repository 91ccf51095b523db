"""Image prompts (spec C.11, C.4): transformers' Gemma 4 vision tower turns pixels into soft tokens, `embed_vision`
projects them into the text space, and they replace the embeddings of the prompt's image placeholder tokens in the
encoder pass (the cache then holds them; denoising passes never see pixels).

With `use_bidirectional_attention == "vision"` the tokens of one image also attend to each other in both directions
inside the causal encoder pass: `vision_groups` numbers each image's run of tokens, and `masks.same_image` turns that
into the mask overlay.

Legend: B batch, P prompt tokens, K image soft tokens of the whole batch, H text hidden, Hv vision hidden,
I images, M patches per image.
"""

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import logging

logger = logging.get_logger(__name__)

VISION_INPUTS = ("pixel_values", "image_position_ids", "mm_token_type_ids", "mm_encoder_outputs")
# What Gemma 4's processor emits for audio and video; DiffusionGemma's released model reads images only (spec C.11).
UNSUPPORTED_INPUTS = ("input_features", "input_features_mask", "pixel_values_videos", "video_position_ids",
                      "audio_values", "videos", "audio")


def check_no_audio_or_video(kwargs: dict) -> None:
    """Audio or video inputs are a ValueError naming them (the model's encoder takes images only)."""
    given = sorted(k for k in UNSUPPORTED_INPUTS if kwargs.get(k) is not None)
    if given:
        raise ValueError(f"DiffusionGemma takes text and images only; got audio/video inputs {given}. Pass images as "
                         "`pixel_values` + `image_position_ids` (from the Gemma 4 processor), or drop these inputs.")


@dataclass(frozen=True)
class PromptImages:
    """A prompt's image soft tokens, ready for an encoder pass.

    Attributes:
        features: [K, H] projected soft tokens in placeholder order (row by row, left to right), or None when only
            `mm_token_type_ids` were given.
        placeholders: [B, P] bool, True at the image placeholder tokens (`config.image_token_id`).
        groups: [B, P] long, the image each token belongs to (0, 1, ... per row; -1 for text), or None when no
            bidirectional overlay applies.
    """

    features: torch.Tensor | None
    placeholders: torch.Tensor
    groups: torch.Tensor | None

    def row(self, b: int, keep: torch.Tensor | None = None) -> "PromptImages":
        """Row b alone ([1, P_b]), its padding dropped where keep [P] is False."""
        counts = self.placeholders.sum(dim=1).tolist()  # [B] soft tokens per row
        start = sum(counts[:b])
        features = None if self.features is None else self.features[start : start + counts[b]]
        keep = slice(None) if keep is None else keep.bool()
        groups = None if self.groups is None else self.groups[b][keep][None]
        return PromptImages(features, self.placeholders[b][keep][None], groups)


def stack_rows(rows: list["PromptImages | None"], lengths: list[int], width: int) -> "PromptImages | None":
    """One `PromptImages` for a pass over rows of `lengths` real tokens, each left-aligned in `width` columns (None
    rows contribute text only). None when no row has images."""
    if all(r is None for r in rows):
        return None
    device = next(r.placeholders.device for r in rows if r is not None)
    placeholders = torch.zeros(len(rows), width, dtype=torch.bool, device=device)  # [n, T]
    groups = torch.full((len(rows), width), -1, dtype=torch.long, device=device)  # [n, T]
    features = []
    for b, (r, n) in enumerate(zip(rows, lengths)):
        if r is None:
            continue
        placeholders[b, :n] = r.placeholders[0]
        if r.groups is not None:
            groups[b, :n] = r.groups[0]
        if r.features is not None:
            features.append(r.features)
    has_groups = any(r is not None and r.groups is not None for r in rows)
    return PromptImages(torch.cat(features) if features else None, placeholders, groups if has_groups else None)


def vision_groups(mm_token_type_ids: torch.Tensor) -> torch.Tensor:
    """mm_token_type_ids [B, P] (0 text, 1 image, 2 video) -> [B, P] long: each contiguous run of non-text tokens
    gets the next id of its row (0, 1, ...), text gets -1 (spec C.4)."""
    media = (mm_token_type_ids == 1) | (mm_token_type_ids == 2)  # [B, P]
    before = torch.nn.functional.pad(media[:, :-1], (1, 0), value=False)  # [B, P] previous token is media
    run_id = torch.cumsum((media & ~before).long(), dim=1) - 1
    return torch.where(media, run_id, torch.full_like(run_id, -1))


def project_images(encoder_parts, pixel_values: torch.Tensor, image_position_ids: torch.Tensor
                   ) -> BaseModelOutputWithPooling:
    """pixel_values [I, M, 3*p*p] + image_position_ids [I, M, 2] (patch (x, y), (-1, -1) for padding patches) ->
    `last_hidden_state` [K, Hv] (the vision tower's soft tokens, padding dropped) and `pooler_output` [K, H] (projected
    by `embed_vision`), the layout of the built-in class's `get_image_features`."""
    tower = encoder_parts.vision_tower
    device = next(tower.parameters()).device
    if device.type != "meta":  # offloaded (device_map): accelerate's hooks move the inputs themselves
        pixel_values, image_position_ids = pixel_values.to(device), image_position_ids.to(device)
    out = tower(pixel_values=pixel_values, pixel_position_ids=image_position_ids)
    soft = out.last_hidden_state  # [K, Hv]
    return BaseModelOutputWithPooling(last_hidden_state=soft, pooler_output=encoder_parts.embed_vision(soft))


def prompt_images(model, input_ids: torch.Tensor, pixel_values=None, image_position_ids=None,
                  mm_token_type_ids=None, mm_encoder_outputs=None) -> PromptImages | None:
    """Validate a prompt's image inputs and encode the images once. None when the prompt has no image inputs.

    Args:
        input_ids: [B, P] prompt, with `config.image_token_id` placeholders (one per soft token).
        pixel_values: [I, M, 3*p*p] patchified images from the Gemma 4 image processor.
        image_position_ids: [I, M, 2] their patch positions (required with pixel_values).
        mm_token_type_ids: [B, P] 0 text, 1 image: the bidirectional overlay's image runs (with
            `use_bidirectional_attention == "vision"`).
        mm_encoder_outputs: precomputed features instead of pixels, `{"image": output}` with `output.pooler_output`
            [K, H] (what `model.get_image_features` returns).
    Raises:
        ValueError: both pixel_values and mm_encoder_outputs; pixel_values without image_position_ids; images for a
            checkpoint without vision weights; images but no placeholders, or a count mismatch; a wrong shape.
    """
    config = model.config
    precomputed = (mm_encoder_outputs or {}).get("image")
    if pixel_values is not None and precomputed is not None:
        raise ValueError("pass either `pixel_values` or `mm_encoder_outputs`, not both")
    has_images = pixel_values is not None or precomputed is not None
    placeholders = input_ids == config.image_token_id  # [B, P]
    if not has_images and mm_token_type_ids is None:
        if image_position_ids is not None:
            raise ValueError("`image_position_ids` were given without `pixel_values`")
        return None
    features = None
    if has_images:
        if getattr(model, "_vision_weights_missing", False):
            why = ("its config.json has `vision_config: null`" if config.vision_config is None else
                   "its files hold no vision tower weights; it was loaded with strict=False")
            raise ValueError(f"this checkpoint is text-only ({why}), so it cannot read images: drop `pixel_values`, "
                             "or load a checkpoint with `model.encoder.vision_tower.*` weights")
        if pixel_values is not None:
            if image_position_ids is None:
                raise ValueError("`pixel_values` need `image_position_ids` (the Gemma 4 processor returns both)")
            if pixel_values.dim() != 3 or tuple(image_position_ids.shape) != (*pixel_values.shape[:2], 2):
                raise ValueError(
                    f"`pixel_values` must be [images, patches, 3*patch*patch] and `image_position_ids` [images, "
                    f"patches, 2]; got {list(pixel_values.shape)} and {list(image_position_ids.shape)}")
            check_patch_inputs(config.vision_config, pixel_values, image_position_ids)
            precomputed = project_images(model.model.encoder, pixel_values, image_position_ids)
        features = precomputed.pooler_output  # [K, H]
        n_tokens, n_features = int(placeholders.sum()), features.shape[0]
        if n_tokens == 0:
            raise ValueError(f"image inputs were given but `input_ids` hold no image placeholder token (id "
                             f"{config.image_token_id}); build the prompt with the processor, which expands each "
                             "image into its placeholders")
        if n_tokens != n_features:
            raise ValueError(f"the prompt has {n_tokens} image placeholder tokens (id {config.image_token_id}) but "
                             f"the images give {n_features} soft tokens; each image needs exactly as many placeholders "
                             "as it has soft tokens (use the processor's `input_ids` unchanged)")
        embed = model.get_decoder().embed_tokens.weight
        features = features.to(embed.device, embed.dtype)
    groups = None
    if mm_token_type_ids is not None:
        if tuple(mm_token_type_ids.shape) != tuple(input_ids.shape):
            raise ValueError(f"`mm_token_type_ids` must have the shape of `input_ids` {list(input_ids.shape)}, got "
                             f"{list(mm_token_type_ids.shape)}")
        check_token_types(mm_token_type_ids, placeholders, features is not None, config.image_token_id)
        if getattr(config.get_text_config(), "use_bidirectional_attention", None) == "vision":
            groups = vision_groups(mm_token_type_ids.to(input_ids.device))
    return PromptImages(features, placeholders, groups)


def check_patch_inputs(vision_config, pixel_values: torch.Tensor, image_position_ids: torch.Tensor) -> None:
    """pixel_values [I, M, 3*p*p] floats; image_position_ids [I, M, 2] integers, each patch (x, y) in
    [0, position_embedding_size) or (-1, -1) for padding (the tower's position table would otherwise index out of
    range or silently clamp)."""
    patch = getattr(vision_config, "patch_size", None)
    if not pixel_values.dtype.is_floating_point:
        raise ValueError(f"`pixel_values` must be floats (the image processor's output), got {pixel_values.dtype}")
    if patch is not None and pixel_values.shape[-1] != 3 * patch * patch:
        raise ValueError(f"`pixel_values` must have 3*patch_size*patch_size = {3 * patch * patch} values per patch "
                         f"(patch_size {patch}), got {pixel_values.shape[-1]}")
    if image_position_ids.dtype.is_floating_point or image_position_ids.dtype == torch.bool:
        raise ValueError(f"`image_position_ids` must be integers (patch x, y), got {image_position_ids.dtype}")
    size = getattr(vision_config, "position_embedding_size", None)
    padding = (image_position_ids == -1).all(dim=-1)  # [I, M]
    inside = (image_position_ids >= 0).all(dim=-1)
    if size is not None:
        inside = inside & (image_position_ids < size).all(dim=-1)
    if not bool((padding | inside).all()):
        bad = image_position_ids[~(padding | inside)][0].tolist()
        raise ValueError(f"`image_position_ids` must hold patch positions in [0, {size}) or (-1, -1) for padding, "
                         f"got {bad}")


def check_token_types(mm_token_type_ids: torch.Tensor, placeholders: torch.Tensor, has_images: bool,
                      image_token_id: int) -> None:
    """mm_token_type_ids [B, P]: 0 text, 1 image, marking exactly the image placeholders of images that were given
    (1s elsewhere would turn text into a bidirectional image block; 2, video, is not served)."""
    if mm_token_type_ids.dtype.is_floating_point:
        raise ValueError(f"`mm_token_type_ids` must be integers (0 text, 1 image), got {mm_token_type_ids.dtype}")
    values = sorted(set(torch.unique(mm_token_type_ids).tolist()) - {0, 1})
    if values:
        raise ValueError(f"`mm_token_type_ids` may hold 0 (text) and 1 (image) only, got {values} (videos and audio "
                         "are not served)")
    marked = mm_token_type_ids == 1
    if bool(marked.any()) and not has_images:
        raise ValueError("`mm_token_type_ids` marks image tokens, but no images were given (`pixel_values` or "
                         "`mm_encoder_outputs`): pass the processor's whole output, or drop `mm_token_type_ids`")
    if has_images and not torch.equal(marked, placeholders.to(marked.device)):
        raise ValueError(f"`mm_token_type_ids` must be 1 exactly at the image placeholder tokens (id "
                         f"{image_token_id}) of `input_ids`, as the processor builds it")


def warn_if_images_missing(config, input_ids: torch.Tensor) -> None:
    """`generate` on a prompt holding image placeholders but no images: a warning, as in the built-in (spec D.3)."""
    if bool((input_ids == config.image_token_id).any()):
        logger.warning_once(
            f"The prompt holds image tokens (id {config.image_token_id}) but no `pixel_values`: they are read as "
            "ordinary tokens. Pass the processor's whole output (`pixel_values`, `image_position_ids`, "
            "`mm_token_type_ids`) along with `input_ids`."
        )


def scatter_images(embeds: torch.Tensor, images: PromptImages | None) -> torch.Tensor:
    """embeds [B, P, H] with the image soft tokens [K, H] written over the placeholders, in order."""
    if images is None or images.features is None:
        return embeds
    return embeds.masked_scatter(images.placeholders[..., None], images.features)
