"""diffusers' own `DiffusionGemmaPipeline` running our model (diffusers_views.py): with the same generator it gives
the same sequences as the pipeline with transformers' built-in class loaded from the same folder, for each of
diffusers' three schedulers, `cache_implementation=None` and "static", fp32 and bf16, with equal and with padded
prompts.

"static": the built-in attends over transformers' whole static buffer, whose hidden slots change SDPA's rounding
(in bf16, its sampled tokens); our `PipelineStaticCache` hands attention the same padded layout, so the sequences
are equal bit for bit. transformers' StaticCache also keeps the last W cached tokens for sliding layers where its
DynamicCache keeps W - 1 (spec C.10), so the built-in's own static and dynamic runs differ in meaning once the window
binds. When a sliding window is shorter than the pipeline's static cache, ours runs exactly as with the dynamic
cache from the first pass, and its sequences are the built-in's dynamic (reference) run's bit for bit
(`test_a_window_shorter_than_the_static_cache_gives_the_dynamic_run`); the layout comparison uses a window the run
never fills.
"""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers import (  # noqa: E402
    BlockRefinementScheduler,
    DiffusionGemmaPipeline,
    DiscreteDDIMScheduler,
    EntropyBoundScheduler,
)

from conftest import pair, tiny_config, tiny_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SCHEDULERS = {
    "block-refinement": lambda: BlockRefinementScheduler(threshold=0.9),
    "discrete-ddim+corrector": lambda: DiscreteDDIMScheduler(corrector_steps=1, corrector_k=2),
    "entropy-bound": lambda: EntropyBoundScheduler(),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(window, dtype) -> (built-in, ours) loaded from one folder the built-in class wrote."""
    made = {}

    def get(window: int, dtype: torch.dtype):
        if (window, dtype) not in made:
            path = tmp_path_factory.mktemp(f"pipe_{window}_{str(dtype)[6:]}")
            made[window, dtype] = pair(path, tiny_config(sliding_window=window), dtype=dtype)
        return made[window, dtype]

    return get


class PaddingProcessor:
    """The tiny tokenizer, padding a batch of chat prompts to one length (left: its padding side), as a model's
    processor does; the pipeline asks `apply_chat_template` for tensors without asking for padding."""

    def __init__(self):
        self.tokenizer = tiny_tokenizer()

    def apply_chat_template(self, *args, **kwargs):
        return self.tokenizer.apply_chat_template(*args, padding=True, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def run(model, scheduler, cache, prompt=("hello", "world"), temperature=1.0, seed=0):
    processor = PaddingProcessor() if len({len(p) for p in prompt}) > 1 else tiny_tokenizer()
    pipe = DiffusionGemmaPipeline(model=model, scheduler=scheduler, processor=processor)
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt=list(prompt), gen_length=32, num_inference_steps=4, temperature=temperature,
                generator=torch.Generator().manual_seed(seed), output_type="seq", cache_implementation=cache).sequences


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("cache,window,dtype", [(None, 8, torch.float32), ("static", 128, torch.float32),
                                                (None, 8, torch.bfloat16), ("static", 128, torch.bfloat16)])
def test_pipeline_with_our_model_equals_the_builtin(models, name, cache, window, dtype):
    builtin, ours = models(window, dtype)
    theirs = run(builtin, SCHEDULERS[name](), cache)
    got = run(ours, SCHEDULERS[name](), cache)
    assert got.shape == (2, 32) and torch.equal(got, theirs)


@pytest.mark.parametrize("cache,window,dtype", [(None, 8, torch.float32), ("static", 128, torch.float32),
                                                (None, 8, torch.bfloat16), ("static", 128, torch.bfloat16)])
def test_padded_prompts_equal_the_builtin(models, cache, window, dtype):
    """Prompts of different lengths: the pipeline left-pads, and the padding mask reaches every pass."""
    builtin, ours = models(window, dtype)
    prompts = ("hi", "a longer prompt here")
    theirs = run(builtin, SCHEDULERS["entropy-bound"](), cache, prompt=prompts)
    assert torch.equal(run(ours, SCHEDULERS["entropy-bound"](), cache, prompt=prompts), theirs)


def test_static_layout_is_what_makes_bf16_agree(models):
    """Without the built-in's padded layout (a plain cache on the pipeline's StaticCache), bf16 rounding differs:
    the padded layout is needed, not incidental."""
    from diffusiongemma import diffusers_views

    builtin, ours = models(128, torch.bfloat16)
    theirs = [run(builtin, SCHEDULERS[n](), "static") for n in SCHEDULERS]
    original = diffusers_views.PipelineStaticCache.write
    diffusers_views.PipelineStaticCache.write = diffusers_views.BlockDiffusionCache.write
    try:
        plain = [run(ours, SCHEDULERS[n](), "static") for n in SCHEDULERS]
    finally:
        diffusers_views.PipelineStaticCache.write = original
    assert not all(torch.equal(a, b) for a, b in zip(plain, theirs))


@pytest.fixture(scope="module")
def short_windows(tmp_path_factory):
    """bf16 (built-in, ours) pairs whose sliding window is shorter than the canvas: (window, canvas) -> pair."""
    return {(w, c): pair(tmp_path_factory.mktemp(f"short_{w}_{c}"), tiny_config(sliding_window=w, canvas_length=c),
                         dtype=torch.bfloat16) for w, c in ((8, 16), (12, 16), (20, 32))}


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("shape", [(8, 16), (12, 16), (20, 32)], ids=lambda s: f"window{s[0]}-canvas{s[1]}")
def test_a_window_shorter_than_the_static_cache_gives_the_dynamic_run(short_windows, name, shape):
    """"static" with a sliding window shorter than the canvas (so than the static cache): ours gives the built-in's
    dynamic run bit for bit, in bf16, for two seeds (the padded static layout in the passes before the window fills
    made these differ: neither the built-in's static run nor its dynamic one)."""
    builtin, ours = short_windows[shape]
    for seed in (0, 1):
        got = run(ours, SCHEDULERS[name](), "static", seed=seed)
        assert torch.equal(got, run(builtin, SCHEDULERS[name](), None, seed=seed)), f"seed {seed}"


def test_a_window_shorter_than_the_static_cache_keeps_a_plain_cache(models):
    from transformers import StaticCache

    from diffusiongemma.diffusers_views import PipelineStaticCache, our_cache

    _, ours = models(8, torch.float32)
    text = ours.config.get_text_config(decoder=True)
    assert not isinstance(our_cache(ours, StaticCache(config=text, max_cache_len=50)), PipelineStaticCache)
    assert isinstance(our_cache(ours, StaticCache(config=text, max_cache_len=8)), PipelineStaticCache)


def test_greedy_pipeline_and_text_output(models):
    builtin, ours = models(8, torch.float32)
    pipe = DiffusionGemmaPipeline(model=ours, scheduler=BlockRefinementScheduler(), processor=tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="hello", gen_length=16, num_inference_steps=3, generator=torch.Generator().manual_seed(1))
    assert isinstance(out.texts[0], str)
    assert torch.equal(run(ours, BlockRefinementScheduler(), None, temperature=0.0),
                       run(builtin, BlockRefinementScheduler(), None, temperature=0.0))


def test_views_hold_no_second_copy_of_the_weights(models):
    _, ours = models(8, torch.float32)
    encoder_view = ours.model.encoder.forward
    mask_view = ours.model.decoder.create_diffusion_decoder_attention_mask
    for view in (encoder_view, mask_view):  # plain objects: no module, no parameter, no buffer
        assert not isinstance(view, torch.nn.Module)
        assert not any(isinstance(v, torch.Tensor) for v in vars(view).values())
    assert vars(encoder_view) == {"model": ours}  # it runs the one stack (`model.encode`)
    before = {n: p.data_ptr() for n, p in ours.named_parameters()}
    run(ours, BlockRefinementScheduler(), None)
    assert {n: p.data_ptr() for n, p in ours.named_parameters()} == before


def test_a_foreign_cache_without_our_encoder_pass_is_refused(models):
    from transformers import DynamicCache

    _, ours = models(8, torch.float32)
    with pytest.raises(TypeError, match="BlockDiffusionCache"):
        ours(decoder_input_ids=torch.zeros(1, 16, dtype=torch.long),
             past_key_values=DynamicCache(config=ours.config.get_text_config(decoder=True)))


def test_our_cache_rides_on_the_pipelines_cache(models):
    from transformers import DynamicCache, StaticCache

    from diffusiongemma.diffusers_views import our_cache

    _, ours = models(8, torch.float32)
    text = ours.config.get_text_config(decoder=True)
    static = StaticCache(config=text, max_cache_len=50)
    mine = our_cache(ours, static)
    assert our_cache(ours, static) is mine and mine.capacity == 50  # reserved once, to the static length
    dynamic = DynamicCache(config=text)
    ours.model.encoder(input_ids=torch.arange(3, 10)[None], past_key_values=dynamic)
    assert dynamic.get_seq_length() == 7 == our_cache(ours, dynamic).length  # what the pipeline reads to slice
