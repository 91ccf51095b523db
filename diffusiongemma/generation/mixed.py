"""Mixed-phase batching for `generate`: every prompt is admitted to the row pool (`pool.py`), which runs until it is
empty; with `max_batch_size` below the batch, a freed slot takes the next waiting prompt.

Lock-step batching (`lockstep.py`) commits all rows together, so a row whose canvas converged waits for the slowest row,
and a finished row keeps its place in the batch. In the pool each row moves on as soon as it can. Left padding is
stripped and every row draws from its own generator, so its output equals running it alone (up to float rounding
between batch shapes).

Legend: N rows in the request batch, P prompt, L canvas length, H hidden, c committed canvases.
"""

import torch

from ..modeling.cache import BlockDiffusionCache
from ..modeling.compile import capacity_bucket
from ..modeling.vision import PromptImages
from .engine import Plan
from .invariant import PerRowCaches
from .options import refuse_padded_prefix
from .observers import RoundStreamer, wants_drafts
from .outputs import generation_output
from .pool import Row, RowPool
from .recording import trace_recorder
from .resolve import GenerationRun


def strip_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """[N, P] (+ mask) -> N prompts without their padding."""
    if attention_mask is None:
        return list(input_ids)
    return [ids[mask.bool()] for ids, mask in zip(input_ids, attention_mask)]


def user_criteria_policy(user_criteria, L: int):
    """The pool's `stop_after_canvas` for `generate`'s stopping criteria: one host read for all ending rows."""
    if not user_criteria:
        return None

    def stop(rows: list[Row]) -> list[bool]:
        verdicts = [user_criteria(torch.cat([r.prompt, *r.canvases])[None], None, new_token_length=L) for r in rows]
        return [bool(v) for v in torch.cat([v.reshape(-1)[:1].to(verdicts[0].device) for v in verdicts]).tolist()]

    return stop


def run_mixed(model, plan: Plan, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, generators: list,
              num_canvases: int, eos_ids, pad_token_id, max_batch_size: int, user_criteria=None,
              first_canvas=None, first_soft=None, images: PromptImages | None = None, batch_invariant: bool = False,
              observers=(), draft: bool = False, compile: dict | None = None, record: bool = False,
              prefix: BlockDiffusionCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [N, P] (left-padded, `attention_mask` [N, P]) -> (sequences [N, P + c*L] with each row's original
    prompt, its canvases and padding after it finished; denoising passes per row [N] int32).

    first_canvas: optional [N, L] ids seeding each row's first canvas; first_soft: optional [N, L, H]; images:
    optional `PromptImages` of the padded batch. batch_invariant: the pool runs every row alone (`invariant.py`).
    observers: called with every pass's `PassEvents` (observers.py); draft: every row reports its drafts.
    compile: the `compiled_denoise_pass` options: denoising passes run compiled per row bucket (`passes.RowForward`).
    record: the events carry every engine call's `PassRecord` (a trace recorder observes them).
    prefix: a `past_key_values` without left padding: each row starts from its row of the committed slots [0, S)
    (copied into its own row cache; `prefix` itself is not changed) and `input_ids` continue it.

    Raises:
        NonFiniteLogitsError: some row's logits held NaN/Inf (the first such row, by its place in the batch).
    """
    L = model.canvas_length
    prompts = strip_padding(input_ids, attention_mask)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("`attention_mask` marks every token of some row as padding; each row needs a prompt")
    longest = max(len(p) for p in prompts)
    slots = min(max_batch_size, len(prompts))
    S = prefix.length if prefix is not None else 0
    # room per row: its prefix, prompt and canvases, plus padding queries of a pass as long as the longest prompt;
    # compiled, both rounded to capacity buckets, so calls with other prompt lengths or budgets mostly share graphs
    needed, padding_room = S + longest + num_canvases * L, max(longest, L)
    if compile is not None:
        needed, padding_room = capacity_bucket(needed, L), capacity_bucket(padding_room, L)
    pool = RowPool(model, slots, needed + padding_room, input_ids.device,
                   stop_after_canvas=user_criteria_policy(user_criteria, L), batch_invariant=batch_invariant,
                   compile=compile, denoise_capacity=needed, record=record)
    waiting = [Row(
        index=i, prompt=p, plan=plan, generator=generators[i], num_canvases=num_canvases, eos_ids=eos_ids,
        pad_token_id=pad_token_id, first_canvas=first_canvas[i] if first_canvas is not None else None,
        first_soft=first_soft[i] if first_soft is not None else None,
        images=images.row(i, None if attention_mask is None else attention_mask[i]) if images is not None else None,
        draft=draft, offset=S + len(p),
    ) for i, p in enumerate(prompts)]
    waiting.reverse()  # pop() takes the first request
    done: list[Row] = []
    while waiting or len(pool):
        while waiting and pool.free:
            pool.admit(waiting.pop())
            if prefix is not None:
                seed_slot(pool.cache, len(pool) - 1, prefix, pool.active[-1].index)
        events = pool.step()
        for observe in observers:
            observe(events)
        if events.faulted:
            raise min(events.faulted, key=lambda f: f[0].index)[1]
        done += events.finished
    done.sort(key=lambda r: r.index)
    fill = pad_token_id if pad_token_id is not None else 0
    sequences = assemble(done, input_ids, L, fill)
    return sequences, torch.tensor([r.passes for r in done], dtype=torch.int32, device=input_ids.device)


def seed_slot(cache, slot: int, prefix: BlockDiffusionCache, b: int) -> None:
    """Pool slot `slot` starts from row b of the shared cache's committed slots [0, S) (its K/V [K, S, D] per
    layer). Without left padding, row b's token t sits at slot t and position t in both caches."""
    S = prefix.length
    target, row = (cache.row(slot), 0) if isinstance(cache, PerRowCaches) else (cache, slot)
    target.seed(row, [k[b, :, :S] for k in prefix.keys], [v[b, :, :S] for v in prefix.values])


def assemble(rows: list[Row], input_ids: torch.Tensor, canvas_length: int, fill: int) -> torch.Tensor:
    """[N, P + c*L]: each row's original (padded) prompt, its canvases, then `fill` up to the longest row."""
    most = max(len(r.canvases) for r in rows)
    out = input_ids.new_full((len(rows), input_ids.shape[1] + most * canvas_length), fill)
    out[:, : input_ids.shape[1]] = input_ids
    for r in rows:
        if r.canvases:
            out[r.index, input_ids.shape[1] : input_ids.shape[1] + len(r.canvases) * canvas_length] = torch.cat(
                r.canvases)
    return out


def generate_mixed(model, run: GenerationRun, plan, batch_invariant: bool = False, streamer=None):
    """Mixed batching: each row commits as soon as its canvas converged and leaves the batch when it finished.
    plan: the call's `engine.Plan` (`loop.plan_for`); batch_invariant: every row runs alone (`invariant.py`);
    streamer: follows the batch round by round (`observers.RoundStreamer`). With `return_trace`, the trace recorder
    observes every pass and records each row's steps as its own (docs/trace-format.md, "Mixed batching")."""
    config, stack = run.config, model.get_decoder()
    sc_logits = run.self_conditioning_logits
    first_soft = None
    if sc_logits is not None:
        dtype = stack.embed_tokens.weight.dtype
        # batch-invariant (invariant.py, place 4): the soft-embedding matmul row by row, as each row alone
        first_soft = (torch.cat([stack.soft_embedding(sc_logits[b : b + 1], round_to=dtype)
                                 for b in range(sc_logits.shape[0])])
                      if batch_invariant else stack.soft_embedding(sc_logits, round_to=dtype))
    attention_mask, prefix = run.attention_mask, run.past_key_values
    if prefix is not None and prefix.length == 0:  # an empty cache: nothing to continue
        prefix = None
    if prefix is not None and prefix.keys[0].shape[0] != run.input_ids.shape[0]:
        raise ValueError(f"`past_key_values` holds {prefix.keys[0].shape[0]} rows, `input_ids` "
                         f"{run.input_ids.shape[0]}: a cache continues the batch it was built for")
    if prefix is not None and attention_mask is not None:  # [B, S + P]: the prefix's part must hold no padding
        if not bool(attention_mask[:, : prefix.length].all()):
            refuse_padded_prefix(run.options.mode)
        attention_mask = attention_mask[:, prefix.length :]  # [B, P]
    observers = []
    if streamer is not None:
        pad = config.pad_token_id
        observers.append(RoundStreamer(streamer, run.input_ids.shape[0], model.canvas_length,
                                       pad if pad is not None else 0))
        streamer.put(run.input_ids.cpu())
    recorder = None
    if run.trace_top_k is not None:  # off by default: no recording work at all
        recorder = trace_recorder(model, run)  # accuracy's recorder (recording.py: generation never imports it)
        observers.append(recorder.observe)
    sequences, passes = run_mixed(
        model, plan, run.input_ids, attention_mask, run.generators, run.num_canvases, run.eos_ids,
        config.pad_token_id, run.max_batch_size or run.input_ids.shape[0], run.user_criteria,
        run.decoder_input_ids, first_soft, run.images, batch_invariant, observers, wants_drafts(streamer),
        run.options.compile, record=recorder is not None, prefix=prefix,
    )
    if streamer is not None:
        streamer.end()
    trace = recorder.finish(sequences) if recorder is not None else None
    return generation_output(config, sequences, run.input_ids.shape[1], passes, trace=trace)
