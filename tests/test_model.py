"""`DiffusionGemmaForBlockDiffusion`'s public accessors (diffusiongemma/model.py)."""

import torch
from transformers import PreTrainedModel

from conftest import pair, tiny_builtin, tiny_model


def test_get_decoder_is_the_one_stack_at_the_builtin_path():
    model, builtin = tiny_model(), tiny_builtin()
    stack = model.get_decoder()
    assert stack is dict(model.named_modules())["model.decoder"]
    # the built-in class resolves get_decoder() to the module at the same path
    assert builtin.get_decoder() is dict(builtin.named_modules())["model.decoder"]
    # transformers' generic lookup would have returned the whole model: the override is needed
    assert PreTrainedModel.get_decoder(model) is model
    assert model.get_input_embeddings() is stack.embed_tokens


def test_get_decoder_runs_both_modes_of_forward():
    model = tiny_model()
    ids, canvas = torch.randint(3, 128, (1, 7)), torch.randint(0, 128, (1, 16))
    with torch.no_grad():
        expected = model(input_ids=ids, decoder_input_ids=canvas).logits
        stack = model.get_decoder()
        cache = stack.new_cache()
        stack.encode(stack.embed_tokens(ids), cache, model.model.encoder.layer_scalars(), backend="sdpa")
        logits = model.head(stack.denoise(canvas, cache, backend="sdpa"))
    assert torch.equal(logits, expected)


def test_without_a_soft_cap_the_logits_are_the_plain_lm_head():
    """`final_logit_softcapping=None` (the built-in cannot run it: it divides by None) leaves the LM head as is."""
    from conftest import tiny_config

    model = tiny_model(tiny_config(final_logit_softcapping=None))
    with torch.no_grad():
        model.lm_head.weight.mul_(500)  # logits far beyond a usual cap of 30
    ids, canvas = torch.randint(3, 128, (1, 7)), torch.randint(0, 128, (1, 16))
    with torch.no_grad():
        out = model(input_ids=ids, decoder_input_ids=canvas, output_hidden_states=True)
        plain = model.lm_head(model.get_decoder().norm(out.hidden_states[-1])).float()
    assert out.logits.abs().max() > 30  # beyond any cap the checkpoint would use: nothing was squashed
    assert torch.equal(out.logits, plain)


def test_soft_embedding_in_row_blocks_equals_the_one_shot_formula():
    """Without autograd the self-conditioning softmax runs in row blocks (no whole fp32 copy alive); the bits must be
    those of softmax(logits.to(round_to), fp32).to(embedding dtype) @ Emb * sqrt(H) on the whole tensor."""
    from conftest import tiny_config

    for dtype in (torch.float32, torch.bfloat16):
        stack = tiny_model(tiny_config(vocab_size=40000)).to(dtype).get_decoder()  # 26 rows per block: 3 blocks
        logits = 8 * torch.randn(2, 33, 40000, generator=torch.Generator().manual_seed(0))
        for round_to in (None, dtype):
            rounded = logits if round_to is None else logits.to(round_to)
            expected = stack.embed_tokens.soft(rounded.softmax(dim=-1, dtype=torch.float32))
            with torch.no_grad():
                got = stack.soft_embedding(logits, round_to=round_to)
            assert torch.equal(got, expected), (dtype, round_to)


def test_return_dict_false_gives_a_tuple_like_the_builtin(tmp_path):
    builtin, ours = pair(tmp_path)
    ids, canvas = torch.randint(3, 128, (2, 7)), torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        output = ours(input_ids=ids, decoder_input_ids=canvas)
        mine = ours(input_ids=ids, decoder_input_ids=canvas, return_dict=False, use_cache=True)
        theirs = builtin(input_ids=ids, decoder_input_ids=canvas, return_dict=False)
    assert isinstance(mine, tuple) and isinstance(theirs, tuple) and len(mine) == len(theirs)
    assert torch.equal(mine[0], output.logits) and torch.equal(mine[0], theirs[0])
    labels = torch.randint(0, 128, (2, 16))
    loss_tuple = ours(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(loss_tuple, tuple) and loss_tuple[0].dim() == 0  # the loss first, as transformers puts it
