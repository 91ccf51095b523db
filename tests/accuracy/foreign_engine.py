"""A foreign engine for the mutation suite (issue 37), written from docs/trace-format.md and the spec, not from our
`generate`: the entropy-bound loop on transformers' built-in class, with one known bug planted at a time, writing a
trace (`foreign_trace`) or answering an OpenAI-compatible completions endpoint (`ForeignEngineServer`, for
`compare --engine-url`). Used by tests/accuracy/test_mutations.py, test_engine_url_mutations.py and
benchmarks/engine_url_catch.py.

Legend: B batch, P prompt, L canvas length, V vocab, K KV heads, S cached length, D head dim, k top-k width.
"""

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import DynamicCache

from diffusiongemma.accuracy.format import Trace

N, T_MIN, T_MAX, BOUND, STABILITY, CONFIDENCE, K = 6, 0.8, 1.2, 0.1, 1, 0.02, 4
CANVASES = 2  # the second canvas reads a committed canvas from the cache (the RoPE-offset bug needs one)
BUGS = ("sc_off_nonzero", "stop_early", "commit_shifted", "temperature_reversed", "accept_untempered",
        "sc_untempered", "sc_half_vocab", "commit_rope_offset", "commit_wrong_slots", "window_w")


def accept_by_entropy(entropy, bound):
    """Spec D.4f: sort ascending; keep a position while the entropies ranked strictly before it sum to <= bound."""
    ranked, order = entropy.sort(dim=-1)
    keep = (ranked.cumsum(dim=-1) - ranked) <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


def entropy_of(logits):
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@torch.no_grad()
def foreign_trace(model, ids, bug=None, canvases: int = CANVASES, steps: int = N, seed: int = 0) -> Trace:
    """One lock-step run of the entropy-bound algorithm with `bug` planted (None: clean), as a trace: `canvases`
    canvases of at most `steps` denoising steps, every draw from one generator seeded with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    B, P = ids.shape
    L, V = model.config.canvas_length, model.config.text_config.vocab_size
    emb = model.model.decoder.embed_tokens
    text_config = model.config.text_config
    if bug == "window_w":  # the cache keeps W cached tokens for the sliding layers instead of W - 1
        text_config = copy.deepcopy(text_config)
        text_config.sliding_window += 1
    cache, sequences, rec = DynamicCache(config=text_config), ids.clone(), {}
    model.model.encoder(input_ids=ids, past_key_values=cache, position_ids=torch.arange(P)[None])

    def add(**tensors):
        for name, value in tensors.items():
            rec.setdefault(name, []).append(value)

    for c in range(canvases):
        start = P + c * L
        canvas = torch.randint(0, V, (B, L), generator=gen)
        sc_logits = torch.zeros(B, L, V) if bug == "sc_off_nonzero" else None  # "off" must be no input at all
        sc_top = (torch.zeros(B, L, K, dtype=torch.int32), torch.zeros(B, L, K))
        stopped = torch.zeros(B, dtype=torch.bool)
        prev_argmax, argmax_final = None, torch.zeros(B, L, dtype=torch.long)
        for step in range(steps):
            n = steps - step
            T = T_MIN + (T_MAX - T_MIN) * ((steps - n) if bug == "temperature_reversed" else n) / steps
            active = ~stopped
            logits = model(past_key_values=cache, decoder_input_ids=canvas, self_conditioning_logits=sc_logits,
                           decoder_position_ids=torch.arange(start, start + L)[None]).logits.float()
            tempered = logits / T
            logp = torch.log_softmax(tempered, dim=-1)
            entropy = entropy_of(tempered)
            argmax = tempered.argmax(dim=-1)
            accepted = accept_by_entropy(entropy_of(logits) if bug == "accept_untempered" else entropy, BOUND)
            sample = torch.multinomial(logp.exp().view(-1, V), 1, generator=gen).view(B, L)
            soft = (torch.zeros(B, L, emb.weight.shape[1]) if sc_logits is None
                    else (sc_logits.softmax(-1) @ emb.weight) * emb.embed_scale)
            top_lp, top_ids = logp.topk(K, dim=-1)
            mean_entropy = entropy.mean(dim=-1)
            # S = 1: the argmax canvas equals the previous step's (the buggy engine ignores that history)
            stable = torch.zeros(B, dtype=torch.bool) if prev_argmax is None else (argmax == prev_argmax).all(dim=-1)
            if bug == "stop_early":
                stable = torch.ones(B, dtype=torch.bool)
            now_stopped = stopped | (active & stable & (mean_entropy < CONFIDENCE))
            add(canvas_index=torch.tensor([c], dtype=torch.int32), step_index=torch.tensor([step], dtype=torch.int32),
                steps_remaining=torch.tensor([n], dtype=torch.int32), temperature=torch.tensor([T]),
                active=active[None], input_canvas=canvas.int()[None], sc_present=torch.tensor([step > 0] * B)[None],
                sc_ids=sc_top[0][None], sc_logprobs=sc_top[1][None], sc_embedding=soft.float()[None],
                topk_ids=top_ids.int()[None], topk_logprobs=top_lp[None], argmax=argmax.int()[None],
                entropy=entropy[None], accepted=accepted[None], stopped=now_stopped[None])
            argmax_final = torch.where(active[:, None], argmax, argmax_final)
            # the next self-conditioning input: this step's tempered distribution, for rows still denoising
            source = tempered
            if bug == "sc_untempered":
                source = logits
            if bug == "sc_half_vocab":
                source = tempered.clone()
                source[..., V // 2:] = float("-inf")
            new_lp, new_ids = torch.log_softmax(source, dim=-1).topk(K, dim=-1)
            keep = active[:, None, None]
            sc_logits = source if sc_logits is None else torch.where(keep, source, sc_logits)
            sc_top = (torch.where(keep, new_ids.int(), sc_top[0]), torch.where(keep, new_lp, sc_top[1]))
            noise = torch.randint(0, V, (B, L), generator=gen)
            canvas = torch.where(active[:, None], torch.where(accepted, sample, noise), canvas)
            prev_argmax, stopped = argmax, now_stopped
            if bool(stopped.all()):
                break
        committed = torch.roll(argmax_final, 1, dims=1) if bug == "commit_shifted" else argmax_final
        sequences = torch.cat([sequences, committed], dim=1)
        offset = 1 if bug == "commit_rope_offset" else 0
        model.model.encoder(input_ids=committed, past_key_values=cache,
                            position_ids=torch.arange(start + offset, start + offset + L)[None])
        if bug == "commit_wrong_slots":
            shift_last_slots(cache, L)
    tensors = {name: torch.cat(parts) for name, parts in rec.items()}
    tensors["sequences"] = sequences.int()
    settings = {"max_denoising_steps": steps, "t_min": T_MIN, "t_max": T_MAX, "stability_threshold": STABILITY,
                "confidence_threshold": CONFIDENCE, "eos_token_id": None, "pad_token_id": None,
                "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": BOUND}}
    manifest = {"format": "diffusiongemma-trace", "version": 1, "prompt_length": P, "canvas_length": L,
                "vocab_size": V, "sampling": "foreign-loop", "top_k": K, "sc_embedding": True,
                "generation_config": settings}
    return Trace(manifest, tensors)


def shift_last_slots(cache, L: int) -> None:
    """Planted (gemma #777's class, literally): the commit's K/V written one cache slot to the left, positions
    right: its first token overwrites the slot of the token before it (the prompt's last token at canvas 0), in
    every layer, so that token's K/V is lost for every later pass."""
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys[:, :, :-L - 1], layer.keys[:, :, -L:]], dim=-2)  # [B, K, S - 1, D]
        layer.values = torch.cat([layer.values[:, :, :-L - 1], layer.values[:, :, -L:]], dim=-2)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length -= 1


def answer(model, tokenizer, prompt: str, max_tokens: int, seed: int, bug, steps: int) -> dict:
    """One completion: the loop run on the prompt's ids for enough canvases to hold `max_tokens`, the new tokens cut
    at the first EOS and at max_tokens (an OpenAI completion choice with vLLM's `token_ids`)."""
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    L = model.config.canvas_length
    trace = foreign_trace(model, ids, bug, canvases=-(-max_tokens // L), steps=steps, seed=seed)
    new = trace.tensors["sequences"][0, ids.shape[1]:].tolist()[:max_tokens]
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    stop = next((j for j, t in enumerate(new) if t in eos), None)
    new, reason = (new, "length") if stop is None else (new[:stop], "stop")
    return {"choices": [{"index": 0, "text": tokenizer.decode(new, skip_special_tokens=True), "token_ids": new,
                         "finish_reason": reason}]}


class ForeignEngineServer:
    """`GET /v1/models` and `POST /v1/completions` on loopback, answered by the foreign loop with `bug` planted, with
    the model's own `max_denoising_steps`. `url` is the base to give `--engine-url`; `stop()` shuts it down."""

    def __init__(self, model, tokenizer, bug=None, name: str = "foreign-engine"):
        steps = int(model.generation_config.max_denoising_steps or N)
        lock = threading.Lock()  # one request at a time: the model and its cache are not shared across threads

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._send({"object": "list", "data": [{"id": name, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with lock, torch.no_grad():
                    self._send(answer(model, tokenizer, body["prompt"], int(body["max_tokens"]),
                                      int(body.get("seed") or 0), bug, steps))

            def _send(self, reply: dict):
                raw = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def perturbed(model):
    """A copy of `model` (loaded again from its folder, fp32) with one attention output projection given noise of
    10 % of its std: the mutation suite's and benchmarks/engine_url_catch.py's perturbed-weight engine."""
    bad = type(model).from_pretrained(model.name_or_path, dtype=torch.float32).eval()
    with torch.no_grad():
        w = bad.model.decoder.layers[1].self_attn.o_proj.weight
        w.add_(0.1 * w.std() * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
    return bad
