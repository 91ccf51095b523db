"""PEFT LoRA on our model (tiny, CPU, fp32): the target list of Gemma recipes, fused experts through parameter
targeting, save/reload, merging, generating from the adapted and the merged model."""

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from diffusiongemma import DiffusionGemmaDataCollator, DiffusionGemmaForBlockDiffusion
from diffusiongemma.modeling.vision_linear import AdaptableClippableLinear
from conftest import tiny_config, tiny_model, tiny_tokenizer

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
L = 16


def fresh_model(seed=0):
    """Freshly initialized (std 0.02) rather than `tiny_model`'s randomized norms, whose confident wrong logits a
    rank-4 adapter takes long to undo."""
    torch.manual_seed(seed)
    return DiffusionGemmaForBlockDiffusion(tiny_config()).eval()


def rows(n=4):
    return [{"prompt": f"say {i}", "completion": "abcdefghijklmnopqrst"[i:] + "xyz"} for i in range(n)]


def train(model, steps=12, lr=1e-2):
    collator = DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=L)
    batch = collator(rows())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def logits(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 128, (2, 6), generator=g)
    canvas = torch.randint(0, 128, (2, L), generator=g)
    with torch.no_grad():
        return model(input_ids=ids, decoder_input_ids=canvas).logits


def lora(model, **kw):
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, **kw))


def test_the_gemma_target_list_adapts_the_text_stack_and_vision_tower(one_thread):
    peft_model = lora(tiny_model())
    adapted = {n.removesuffix(".lora_A") for n, _ in peft_model.named_modules() if n.endswith(".lora_A")}
    text = [n for n in adapted if ".decoder.layers." in n]
    # 6 layers: q, k, o, gate, up, down each, plus v on the 5 sliding layers (full layers have no v_proj)
    assert len(text) == 6 * 6 + 5
    assert sum(".vision_tower." in n for n in adapted) == 7  # one vision layer: q k v o gate up down
    assert sum(".self_conditioning." in n for n in adapted) == 3
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert isinstance(peft_model.base_model.model.model.encoder.vision_tower.encoder.layers[0].self_attn.q_proj
                      .get_base_layer(), AdaptableClippableLinear)


def test_vision_linears_keep_their_checkpoint_keys_and_outputs(one_thread):
    model = tiny_model()
    keys = [k for k in model.state_dict() if ".vision_tower." in k and "q_proj" in k]
    assert keys == ["model.encoder.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"]
    q = model.model.encoder.vision_tower.encoder.layers[0].self_attn.q_proj
    x = torch.randn(3, 32)
    assert q.weight is q.linear.weight and q.bias is None and (q.in_features, q.out_features) == (32, 32)
    assert torch.equal(q(x), q.linear(x))


def test_lora_trains_saves_reloads_merges_and_generates(tmp_path, one_thread):
    base = fresh_model()
    base_logits = logits(base)
    peft_model = lora(base).train()
    losses = train(peft_model, steps=20, lr=1e-2)
    assert sum(losses[-4:]) / 4 < 0.92 * losses[0], losses  # measured: 9.57 -> 8.48 (diffusion + AR loss)
    peft_model.eval()
    tuned = logits(peft_model)
    assert not torch.allclose(tuned, base_logits, atol=1e-3)

    peft_model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(fresh_model(), tmp_path / "adapter").eval()
    assert torch.equal(logits(reloaded), tuned)

    merged = reloaded.merge_and_unload()
    assert isinstance(merged, DiffusionGemmaForBlockDiffusion)
    torch.testing.assert_close(logits(merged), tuned, rtol=1e-5, atol=1e-5)  # fp32 rounding of W + BA

    ids = torch.tensor([[5, 6, 7]])
    out = peft_model.generate(input_ids=ids, max_new_tokens=2 * L, max_denoising_steps=4, return_dict_in_generate=False)
    assert out.shape[0] == 1 and out.shape[1] >= 3 + L
    merged.save_pretrained(tmp_path / "merged")  # a plain checkpoint: loads (and serves) like any other
    again = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(logits(again), logits(merged), rtol=1e-6, atol=1e-6)


def test_fused_experts_take_lora_through_parameter_targeting(one_thread):
    peft_model = get_peft_model(fresh_model(), LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS, target_parameters=["experts.gate_up_proj", "experts.down_proj"]))
    expert_params = [n for n, p in peft_model.named_parameters() if p.requires_grad and ".experts." in n]
    assert len(expert_params) == 2 * 2 * 6  # lora A and B of two parameters in six layers
    losses = train(peft_model.train(), steps=6)
    grads = [p.grad for n, p in peft_model.named_parameters() if n in expert_params]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    peft_model.eval()
    tuned = logits(peft_model)
    merged = peft_model.merge_and_unload()
    torch.testing.assert_close(logits(merged), tuned, rtol=1e-5, atol=1e-5)
    assert losses[-1] < losses[0]
