"""Our samplers against diffusers' schedulers (the reference for them, as transformers is for entropy-bound): the
same logits, canvas and random source over a multi-step run give the same next canvas and the same commits, bit for
bit.

- "reference" samplers draw from the global RNG over the whole batch: equal to diffusers with `generator=None`
  after the same `torch.manual_seed`.
- "fast" samplers draw from one generator per row: row b equals diffusers run on row b alone with that row's
  generator (diffusers' one generator for a whole batch interleaves the rows' draws, which per-row generators cannot
  do: that is where ours differs, on purpose, so a row's tokens do not depend on the rest of the batch).
- Entropy bound: our reference sampler against `EntropyBoundScheduler` (global RNG). diffusers divides by its
  temperature inside `step`; the engine divides before the sampler, so both get the same tempered logits here.
  Our fast entropy-bound sampler draws by inverse CDF instead (same distribution, tests/generation/test_fast_sampler.py).
"""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers import BlockRefinementScheduler, DiscreteDDIMScheduler, EntropyBoundScheduler  # noqa: E402

from diffusiongemma import (  # noqa: E402
    BlockRefinementSamplerConfig,
    DiscreteDDIMSamplerConfig,
    EntropyBoundSamplerConfig,
)
from diffusiongemma.generation.discrete_ddim import pass_schedule  # noqa: E402
from diffusiongemma.generation.sampler import SamplerContext, init_sampler_state, sampler_class_for  # noqa: E402

B, L, V, N = 3, 16, 64, 6


def step_logits(steps: int, seed: int = 0, scale: float = 4.0) -> list[torch.Tensor]:
    """[B, L, V] fp32 logits per step, peaked enough that some positions pass a 0.5-0.95 threshold."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.randn(B, L, V, generator=g) * scale
        x[:, : L // 2, 7] += 12.0  # half the canvas confident on token 7
        out.append(x)
    return out


def start_canvas(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(seed))


class Ours:
    """Runs one of our samplers step by step, carrying its state as the engine does."""

    def __init__(self, config, sampling: str, steps: int = N, rows: int = B):
        self.sampler = sampler_class_for(config, sampling)(config, SamplerContext(V, steps))
        self.state = init_sampler_state(self.sampler, rows, L, torch.device("cpu"))

    def step(self, logits, canvas, k, generators=None):
        extra = {} if self.state is None else {"state": self.state}
        out = self.sampler.step(logits.clone(), canvas, None, [k] * canvas.shape[0], generators, None, **extra)
        self.state = out.state
        return out


def block_refinement(config: BlockRefinementSamplerConfig) -> BlockRefinementScheduler:
    scheduler = BlockRefinementScheduler(threshold=config.threshold, editing_threshold=config.editing_threshold)
    scheduler.set_timesteps(N, block_length=L)
    return scheduler


BR_CONFIGS = [BlockRefinementSamplerConfig(), BlockRefinementSamplerConfig(threshold=0.5),
              BlockRefinementSamplerConfig(threshold=0.9, editing_threshold=0.6),
              BlockRefinementSamplerConfig(greedy=True, editing_threshold=0.3)]


@pytest.mark.parametrize("config", BR_CONFIGS, ids=lambda c: str(c.to_dict()))
def test_block_refinement_reference_matches_diffusers_global_rng(config):
    logits, temperature = step_logits(N), 0.0 if config.greedy else 1.0
    theirs, ours = block_refinement(config), Ours(config, "reference")
    canvas_t = canvas_o = start_canvas()
    committed_before = torch.zeros(B, L, dtype=torch.bool)
    newly_any = edits = 0
    for k in range(N):
        torch.manual_seed(10 + k)
        t = theirs.step(logits[k].clone(), k, canvas_t, mask_token_id=None, temperature=temperature, generator=None)
        torch.manual_seed(10 + k)
        o = ours.step(logits[k], canvas_o, k)
        assert torch.equal(o.canvas, t.prev_sample), f"step {k}"
        assert torch.equal(o.accepted & ~committed_before, t.transfer_index), f"step {k}"  # this step's commits
        assert torch.equal(o.state, theirs._committed)
        committed_before = o.state
        newly_any += int(t.transfer_index.sum())
        edits += int(t.editing_transfer_index.sum())
        canvas_t, canvas_o = t.prev_sample, o.canvas
    assert bool(committed_before.all()) and newly_any == B * L  # the quota commits the whole canvas by step N
    assert (edits > 0) == (config.editing_threshold is not None)  # editing ran where it was asked for


@pytest.mark.parametrize("config", BR_CONFIGS[:3], ids=lambda c: str(c.to_dict()))
def test_block_refinement_fast_matches_diffusers_row_by_row(config):
    logits = step_logits(N, seed=3)
    ours = Ours(config, "fast")
    ours_gens = [torch.Generator().manual_seed(100 + b) for b in range(B)]
    canvas = start_canvas()
    outs = []
    c = canvas
    for k in range(N):
        o = ours.step(logits[k], c, k, ours_gens)
        outs.append(o.canvas)
        c = o.canvas
    for b in range(B):  # diffusers on row b alone, with row b's generator
        theirs, g = block_refinement(config), torch.Generator().manual_seed(100 + b)
        c = canvas[b : b + 1]
        for k in range(N):
            c = theirs.step(logits[k][b : b + 1].clone(), k, c, mask_token_id=None, temperature=1.0,
                            generator=g).prev_sample
            assert torch.equal(c[0], outs[k][b]), f"row {b} step {k}"


def ddim_run(config: DiscreteDDIMSamplerConfig, logits, canvas, generator, ours=None, generators=None):
    """Drive diffusers' scheduler over the passes of a canvas the way its pipeline does (predictor, then the corrector
    sweeps of the first steps), and ours over the same passes; returns both canvases after every pass."""
    schedule = pass_schedule(len(logits), config.corrector_steps)
    predictors = schedule[-1][0] + 1
    theirs = DiscreteDDIMScheduler(corrector_steps=config.corrector_steps, corrector_k=config.corrector_k,
                                   corrector_selection=config.corrector_selection,
                                   corrector_selection_tau=config.corrector_selection_tau)
    theirs.set_timesteps(predictors)
    got_t, got_o = [], []
    c_t = c_o = canvas
    for k, (i, correcting) in enumerate(schedule):
        if generator is None:
            torch.manual_seed(50 + k)
        if correcting:
            c_t = theirs.step_correct(logits[k].clone(), i, c_t, generator=generator).prev_sample
        else:
            c_t = theirs.step(logits[k].clone(), i, c_t, temperature=0.0 if config.greedy else 1.0,
                              generator=generator).prev_sample
        got_t.append(c_t)
        if ours is not None:
            if generator is None:
                torch.manual_seed(50 + k)
            c_o = ours.step(logits[k], c_o, k, generators).canvas
            got_o.append(c_o)
    return got_t, got_o


DDIM_CONFIGS = [DiscreteDDIMSamplerConfig(), DiscreteDDIMSamplerConfig(greedy=True),
                DiscreteDDIMSamplerConfig(corrector_steps=2, corrector_k=3),
                DiscreteDDIMSamplerConfig(corrector_steps=1, corrector_k=2, corrector_selection="lowest_maxprob",
                                          corrector_selection_tau=0.5),
                DiscreteDDIMSamplerConfig(corrector_steps=1, corrector_selection="lowest_current_prob"),
                DiscreteDDIMSamplerConfig(corrector_steps=1, corrector_k=4, corrector_selection="random")]


@pytest.mark.parametrize("config", DDIM_CONFIGS, ids=lambda c: str(c.to_dict()))
def test_discrete_ddim_reference_matches_diffusers_global_rng(config):
    steps = 8
    logits = step_logits(steps, seed=5, scale=2.0)
    theirs, ours = ddim_run(config, logits, start_canvas(), None, Ours(config, "reference", steps))
    for k, (t, o) in enumerate(zip(theirs, ours)):
        assert torch.equal(o, t), f"pass {k}"
    changed = [not torch.equal(a, b) for a, b in zip(theirs, theirs[1:])]
    assert any(changed)


@pytest.mark.parametrize("config", DDIM_CONFIGS[::2], ids=lambda c: str(c.to_dict()))
def test_discrete_ddim_fast_matches_diffusers_row_by_row(config):
    steps = 8
    logits = step_logits(steps, seed=6, scale=2.0)
    canvas = start_canvas()
    ours = Ours(config, "fast", steps)
    gens = [torch.Generator().manual_seed(200 + b) for b in range(B)]
    c, outs = canvas, []
    for k in range(steps):
        c = ours.step(logits[k], c, k, gens).canvas
        outs.append(c)
    for b in range(B):
        theirs, _ = ddim_run(config, [x[b : b + 1] for x in logits], canvas[b : b + 1],
                             torch.Generator().manual_seed(200 + b))
        for k in range(steps):
            assert torch.equal(theirs[k][0], outs[k][b]), f"row {b} pass {k}"


@pytest.mark.parametrize("steps,c", [(8, 2), (5, 1), (6, 0), (1, 3), (12, 3)])
def test_pass_schedule_spends_the_pipelines_budget(steps, c):
    schedule = pass_schedule(steps, c)
    assert len(schedule) == steps  # every pass is one model forward, as diffusers' pipeline counts them
    corrected = (steps - 1) // (1 + c) if c else 0
    assert schedule[-1][0] + 1 == steps - corrected * c
    assert sum(correcting for _, correcting in schedule) == corrected * c


@pytest.mark.parametrize("bound", [0.1, 1.0])
def test_entropy_bound_reference_matches_diffusers_global_rng(bound):
    t_min, t_max = 0.4, 0.8
    theirs = EntropyBoundScheduler(entropy_bound=bound, t_max=t_max, t_min=t_min, num_inference_steps=N)
    theirs.set_timesteps(N)
    ours = Ours(EntropyBoundSamplerConfig(entropy_bound=bound), "reference")
    logits = step_logits(N, seed=7)
    canvas_t = canvas_o = start_canvas()
    for k in range(N):
        temperature = t_min + (t_max - t_min) * ((N - k) / N)  # diffusers' schedule, in double
        torch.manual_seed(70 + k)
        t = theirs.step(logits[k].clone(), k, canvas_t, generator=None)
        torch.manual_seed(70 + k)
        o = ours.step(logits[k] / temperature, canvas_o, k)  # the engine divides before the sampler
        assert torch.equal(o.canvas, t.prev_sample) and torch.equal(o.accepted, t.accepted_index), f"step {k}"
        canvas_t, canvas_o = t.prev_sample, o.canvas
