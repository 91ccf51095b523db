"""Tiny builders shared by the whole suite: configs, models (ours and transformers' built-in), a tokenizer.

Nothing is downloaded; everything is fp32 on CPU and small enough to run in milliseconds.
"""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import DiffusionGemmaConfig, PreTrainedTokenizerFast
from transformers import DiffusionGemmaForBlockDiffusion as BuiltinModel

import diffusiongemma  # noqa: F401  (registers the Auto classes)
from diffusiongemma import DiffusionGemmaForBlockDiffusion

VISION = dict(
    model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, head_dim=16,
)


def tiny_config(**overrides) -> DiffusionGemmaConfig:
    """6 layers (5 sliding + 1 full), window 8, canvas 16, vocab 128; keyword overrides go to the text config,
    except `canvas_length`."""
    canvas_length = overrides.pop("canvas_length", 16)
    text = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, num_experts=4,
        top_k_experts=2, moe_intermediate_size=32, sliding_window=8, max_position_embeddings=1024,
        final_logit_softcapping=30.0,
    )
    text.update(overrides)
    return DiffusionGemmaConfig(text_config=text, vision_config=dict(VISION), canvas_length=canvas_length)


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give norms, router scales and layer scalars non-trivial values so every weight matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("scale"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1 + 0.2 * torch.randn(b.shape, generator=g))
    return model


def tiny_builtin(config=None, seed: int = 0) -> BuiltinModel:
    torch.manual_seed(seed)
    return randomize_(BuiltinModel(config or tiny_config()), seed).eval()


def tiny_model(config=None, seed: int = 0) -> DiffusionGemmaForBlockDiffusion:
    torch.manual_seed(seed)
    return randomize_(DiffusionGemmaForBlockDiffusion(config or tiny_config()), seed).eval()


def pair(tmp_path, config=None, seed: int = 0, dtype: torch.dtype | None = None):
    """(built-in model, our model) holding the same weights, both loaded from one folder the built-in class wrote.

    Both load the way users load a checkpoint: CPU kernels (grouped_mm among them) can round differently on tensors
    at different memory alignments, and two models loaded from one file get the same alignment.
    """
    tiny_builtin(config, seed).save_pretrained(tmp_path)
    kwargs = {} if dtype is None else {"dtype": dtype}
    builtin = BuiltinModel.from_pretrained(tmp_path, **kwargs).eval()
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, **kwargs).eval()
    return builtin, ours


CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<model>{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 128) -> PreTrainedTokenizerFast:
    """Character-level tokenizer: ids 0-3 are <pad> <eos> <bos> <unk>, then printable ASCII, then filler tokens."""
    chars = [chr(c) for c in range(32, 127)]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    for i in range(len(vocab), vocab_size):
        vocab[f"<x{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from a second thread, and on a busy machine every parallel region can stall for
    milliseconds waiting for it: run single-threaded, then restore the setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def buckets(monkeypatch):
    """The (rows R, capacity C') of every compiled row pass (`modeling.compile.RowDenoisePass`) while a test runs,
    on whichever thread calls it (the server's scheduler)."""
    from diffusiongemma.modeling.compile import RowDenoisePass

    seen = []
    inner = RowDenoisePass.__call__

    def call(self, canvas, cache, soft, capacity):
        seen.append((canvas.shape[0], capacity))
        return inner(self, canvas, cache, soft, capacity)

    monkeypatch.setattr(RowDenoisePass, "__call__", call)
    return seen


@pytest.fixture(scope="session")
def saved_pair(tmp_path_factory):
    """A folder written by the built-in class (+ tokenizer), the built-in model, and ours loaded from it."""
    path = tmp_path_factory.mktemp("tiny_ckpt")
    builtin, ours = pair(path)
    tiny_tokenizer().save_pretrained(path)
    return path, builtin, ours


def write_generation_config(path, **fields) -> None:
    with open(path / "generation_config.json", "w") as f:
        json.dump(fields, f)
