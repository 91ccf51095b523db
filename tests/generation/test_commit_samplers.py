"""The commit-style samplers (block refinement, confidence threshold, discrete DDIM) through every door of
`generate`: reference and fast, lock-step and mixed, traces, generation_config.json, the text-generation pipeline;
their configs' checks; the confidence-threshold rule on hand-built numbers (diffusers has no counterpart)."""

import pytest
import torch
from transformers import pipeline

from conftest import tiny_model, tiny_tokenizer

from diffusiongemma import (
    BlockRefinementSamplerConfig,
    ConfidenceThresholdSamplerConfig,
    DiffusionGemmaGenerationConfig,
    DiscreteDDIMSamplerConfig,
)
from diffusiongemma.generation.confidence_threshold import threshold_commits

pytestmark = pytest.mark.usefixtures("one_thread")
KW = dict(max_new_tokens=32, max_denoising_steps=6, eos_token_id=None, pad_token_id=0)
CONFIGS = [BlockRefinementSamplerConfig(), BlockRefinementSamplerConfig(threshold=0.5, editing_threshold=0.5),
           ConfidenceThresholdSamplerConfig(), ConfidenceThresholdSamplerConfig(factor=1.0, greedy=True),
           DiscreteDDIMSamplerConfig(), DiscreteDDIMSamplerConfig(corrector_steps=1, corrector_k=2)]
IDS = [str(c.to_dict()) for c in CONFIGS]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_fast_lockstep_equals_mixed_and_alone(model, config):
    ids = torch.randint(3, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    lock = model.generate(ids, sampler_config=config, seed=[1, 2, 3], batching="lockstep", **KW)
    mixed = model.generate(ids, sampler_config=config, seed=[1, 2, 3], batching="mixed", max_batch_size=2, **KW)
    assert torch.equal(lock.sequences, mixed.sequences)
    alone = model.generate(ids[2:], sampler_config=config, seed=[3], **KW)
    assert torch.equal(alone.sequences[0], lock.sequences[2])
    other = model.generate(ids, sampler_config=config, seed=[4, 5, 6], batching="lockstep", **KW)
    assert not torch.equal(other.sequences, lock.sequences)  # the seed reaches the sampler


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_reference_draws_from_the_global_rng(model, config):
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)
    a = model.generate(ids, sampler_config=config, sampling="reference", **KW).sequences
    torch.manual_seed(7)
    b = model.generate(ids, sampler_config=config, sampling="reference", **KW).sequences
    torch.manual_seed(8)
    c = model.generate(ids, sampler_config=config, sampling="reference", **KW).sequences
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="mixed"):
        model.generate(ids, sampler_config=config, sampling="reference", batching="mixed", **KW)


def test_block_refinement_trace_commits_the_quota_and_keeps_commits(model):
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    config = BlockRefinementSamplerConfig(threshold=1.0)  # the quota only: ceil((s + 1) * 16 / 6) per row
    out = model.generate(ids, sampler_config=config, seed=0, batching="lockstep", return_trace=True, **KW)
    trace = out.trace
    assert trace.manifest["generation_config"]["sampler_config"] == config.to_dict()
    accepted = trace.tensors["accepted"]  # [R, B, L], R = canvases * steps (the tiny model never stops early)
    steps = accepted.shape[0] // 2
    for c in range(2):
        counts = accepted[c * steps : (c + 1) * steps].sum(-1)  # [steps, B]
        assert counts[:, 0].tolist() == [3, 6, 8, 11, 14, 16][:steps]
        prev = accepted[c * steps : (c + 1) * steps - 1]
        assert bool((accepted[c * steps + 1 : (c + 1) * steps] | ~prev).all())  # a commit is never taken back
    # a position committed before step r keeps its token: the canvases read at steps r and r + 1 agree there
    canvas = trace.tensors["input_canvas"]
    for r in range(1, steps - 1):
        assert bool((canvas[r + 1][accepted[r - 1]] == canvas[r][accepted[r - 1]]).all())
        assert not bool((canvas[r + 1][~accepted[r]] == canvas[r][~accepted[r]]).all())  # the others re-noised


def test_confidence_threshold_rule_by_hand():
    committed = torch.tensor([[False, False, False, True]])
    confidence = torch.tensor([[0.8, 0.99, 0.7, 1.0]])
    # fixed threshold 0.75: 0.99 and 0.8 pass; the committed 1.0 is never committed again
    assert threshold_commits(committed, confidence, 0.75, None).tolist() == [[True, True, False, False]]
    # threshold 0.999: nothing passes, the most confident free position commits anyway
    assert threshold_commits(committed, confidence, 0.999, None).tolist() == [[False, True, False, False]]
    # factor 1.0: bars 1 - 1/2, 1 - 1/3, 1 - 1/4 = 0.5, 0.667, 0.75 for ranks 0.99, 0.8, 0.7 -> two commit
    assert threshold_commits(committed, confidence, 0.9, 1.0).tolist() == [[True, True, False, False]]
    # factor 0.1: bars 0.95, 0.967 -> only 0.99
    assert threshold_commits(committed, confidence, 0.9, 0.1).tolist() == [[False, True, False, False]]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_config_round_trips_through_generation_config_json(tmp_path, config):
    DiffusionGemmaGenerationConfig(sampler_config=config).save_pretrained(tmp_path)
    text = (tmp_path / "generation_config.json").read_text()
    assert f'"_cls_name": "{type(config).__name__}"' in text
    loaded = DiffusionGemmaGenerationConfig.from_pretrained(tmp_path).sampler_config
    assert type(loaded) is type(config) and loaded == config


@pytest.mark.parametrize("make,match", [
    (lambda: BlockRefinementSamplerConfig(threshold=1), "BlockRefinementSamplerConfig.threshold"),
    (lambda: BlockRefinementSamplerConfig(threshold=1.5), "BlockRefinementSamplerConfig.threshold"),
    (lambda: BlockRefinementSamplerConfig(editing_threshold=0.0), "editing_threshold"),
    (lambda: BlockRefinementSamplerConfig(greedy=1), "greedy"),
    (lambda: ConfidenceThresholdSamplerConfig(factor=-1.0), "ConfidenceThresholdSamplerConfig.factor"),
    (lambda: ConfidenceThresholdSamplerConfig(threshold=0.0), "threshold"),
    (lambda: DiscreteDDIMSamplerConfig(corrector_steps=-1), "corrector_steps"),
    (lambda: DiscreteDDIMSamplerConfig(corrector_k=0), "corrector_k"),
    (lambda: DiscreteDDIMSamplerConfig(corrector_selection="best"), "corrector_selection"),
    (lambda: DiscreteDDIMSamplerConfig(corrector_selection_tau=0.0), "corrector_selection_tau"),
])
def test_bad_settings_name_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_text_generation_pipeline_takes_a_sampler_config(model):
    pipe = pipeline("text-generation", model=model, tokenizer=tiny_tokenizer())
    tok = tiny_tokenizer()
    config = ConfidenceThresholdSamplerConfig(threshold=0.5)
    out = pipe("hello", sampler_config=config, seed=4, max_new_tokens=16, max_denoising_steps=3)
    ids = tok("hello", return_tensors="pt")["input_ids"]
    direct = model.generate(ids, sampler_config=config, seed=4, max_new_tokens=16, max_denoising_steps=3,
                            pad_token_id=tok.pad_token_id)
    assert out[0]["generated_text"] == tok.decode(direct.sequences[0], skip_special_tokens=True)


def test_block_refinement_quota_per_row_step():
    from diffusiongemma.generation.block_refinement import quota_commits

    committed = torch.zeros(2, 16, dtype=torch.bool)
    committed[1, :5] = True
    confidence = torch.linspace(0.1, 0.5, 16).expand(2, 16).contiguous()  # below the threshold everywhere
    # L = 16, N = 6: after step 0 three are owed; after step 2, ceil(3 * 16 / 6) = 8 minus the 5 committed = 3
    new = quota_commits(committed, confidence, [0, 2], 6, 0.95)
    assert new.sum(-1).tolist() == [3, 3]
    assert new[0, -3:].all() and new[1, -3:].all()  # the most confident free positions
    assert not (new & committed).any()
    same = quota_commits(committed, confidence, [2, 2], 6, 0.95)  # the lock-step path (one host int)
    assert same.sum(-1).tolist() == [8, 3]
