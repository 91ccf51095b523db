"""Fast mode's two ways through a batch other than one lock-step loop: mixed batching (`mixed.py` schedules every row
on its own) and lock-step over consecutive chunks of `max_batch_size` rows (the baseline mixed batching beats).

Legend: B batch, P prompt, L canvas length, V vocab, H hidden, c committed canvases.
"""

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import logging

from .mixed import run_mixed
from .outputs import DiffusionGemmaGenerationOutput, generation_output
from .resolve import GenerationRun

logger = logging.get_logger(__name__)


def generate_mixed(model, run: GenerationRun, plan, batch_invariant: bool = False):
    """Mixed batching: each row commits as soon as its canvas converged and leaves the batch when it finished.
    plan: the call's `engine.Plan` (`loop.plan_for`); batch_invariant: every row runs alone (`invariant.py`)."""
    config, stack = run.config, model.get_decoder()
    sc_logits = run.self_conditioning_logits
    first_soft = None
    if sc_logits is not None:
        dtype = stack.embed_tokens.weight.dtype
        # batch-invariant (invariant.py, place 4): the soft-embedding matmul row by row, as each row alone
        first_soft = (torch.cat([stack.soft_embedding(sc_logits[b : b + 1], round_to=dtype)
                                 for b in range(sc_logits.shape[0])])
                      if batch_invariant else stack.soft_embedding(sc_logits, round_to=dtype))
    sequences, passes = run_mixed(
        model, plan, run.input_ids, run.attention_mask, run.generators, run.num_canvases, run.eos_ids,
        config.pad_token_id, run.max_batch_size or run.input_ids.shape[0], run.user_criteria,
        run.decoder_input_ids, first_soft, run.images, batch_invariant,
    )
    return generation_output(config, sequences, run.input_ids.shape[1], passes)


def chunk_images(images, offsets: list[int], a: int, b: int) -> dict:
    """`generate` keywords giving rows [a, b) their share of the batch's image soft tokens (offsets: [B+1] where
    each row's start in `images.features`) and their image runs."""
    out = {}
    end = offsets[min(b, len(offsets) - 1)]
    if images.features is not None and end > offsets[a]:
        out["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(pooler_output=images.features[offsets[a]:end])}
    if images.groups is not None:
        out["mm_token_type_ids"] = (images.groups[a:b] >= 0).long()  # the same runs (adjacent runs never touch)
    return out


def generate_in_chunks(generate, model, run: GenerationRun):
    """Lock-step fast mode over consecutive chunks of `run.max_batch_size` rows; `generate` runs one chunk.

    Each chunk runs the sampler the call resolved (`run.sampling`, under the config's `sampler_config`) and keeps its
    rows' generators, so a row's tokens are those of its chunk run alone. Chunks that stopped
    after fewer canvases are filled up to the longest with pad (with 0, and a warning, when there is no pad id).
    `resolve_batching` refused a streamer and `past_key_values` here: chunks share neither.
    """
    config, chunk = run.config, run.max_batch_size
    ids, mask = run.input_ids, run.attention_mask
    seeded = {"decoder_input_ids": run.decoder_input_ids, "self_conditioning_logits": run.self_conditioning_logits}
    outs = []
    offsets = [0] + run.images.placeholders.sum(dim=1).cumsum(0).tolist() if run.images is not None else None
    for a in range(0, ids.shape[0], chunk):
        # the chunk's rows' image soft tokens (encoded once, above) and image runs
        vision = chunk_images(run.images, offsets, a, a + chunk) if run.images is not None else {}
        outs.append(generate(
            model, ids[a : a + chunk], None if mask is None else mask[a : a + chunk], generation_config=config,
            logits_processor=run.processors, stopping_criteria=run.user_criteria, sampling=run.sampling,
            generator=run.generators[a : a + chunk], batching="lockstep", return_dict_in_generate=True,
            constraint=run.constraint, tokenizer=run.tokenizer,
            **{k: v[a : a + chunk] for k, v in seeded.items() if v is not None}, **vision,
        ))
    width = max(o.sequences.shape[1] for o in outs)
    pad = config.pad_token_id
    if pad is None and any(o.sequences.shape[1] < width for o in outs):
        logger.warning_once("lock-step chunks stopped after different numbers of canvases and there is no "
                            "`pad_token_id`: the shorter chunks' rows are filled with token 0")
    sequences = torch.cat([torch.nn.functional.pad(o.sequences, (0, width - o.sequences.shape[1]),
                                                   value=pad if pad is not None else 0) for o in outs])
    if not config.return_dict_in_generate:
        return sequences
    return DiffusionGemmaGenerationOutput(
        sequences=sequences, tokens_per_forward=torch.cat([o.tokens_per_forward for o in outs])
    )
