"""Cost of constrained denoising: the Viterbi projection of one canvas (constraints/viterbi.py, what the engine runs
once per denoising step) against one decoder pass, at vocab 32768 and 262144, and its memory.

The tokenizer is synthetic but shaped like a real one: every printable ASCII character, then multi-character pieces
(letters, digits, punctuation, a leading space) up to the vocabulary size. The schema is realistic: a nested object
with an enum, an array of numbers, an integer and free strings. The decoder pass is (a) the benchmark's small model
(hidden 256, 6 layers, 16 experts; generate_vs_builtin.py) over one canvas, LM head included, and (b) the 26B model's
LM head alone (hidden 2816), a lower bound for a real decoder pass. Medians.

    python benchmarks/constraints.py --threads 1
    python benchmarks/constraints.py --threads 1 --vocabs 32768 --canvas 256 --device cuda
    python benchmarks/constraints.py --threads 1 --constraint tools     # a 3-tool ToolCalls union instead

With `--constraint tools` the constraint is `ToolCalls(TOOLS, tool_choice="required")` (three functions with bounds,
enums, nested objects and arrays, Gemma 4's call syntax) and Gemma 4's three call markers are special tokens of the
synthetic tokenizer.
"""

import argparse
import platform
import random
import statistics
import time

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from diffusiongemma import DiffusionGemmaForBlockDiffusion, JsonSchema, ToolCalls
from diffusiongemma.constraints import compile_constraint
from diffusiongemma.constraints.viterbi import allowed_mask, constrained_path
from generate_vs_builtin import randomize_, small_config

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "country": {"enum": ["France", "Germany", "Japan", "Brazil", "Kenya"]}},
            "required": ["street", "city", "country"]},
        "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 8},
        "age": {"type": "integer"},
        "bio": {"type": "string"},
    },
    "required": ["name", "address", "scores", "age", "bio"],
}


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "book_table", "parameters": {"type": "object", "properties": {
        "restaurant": {"type": "string"}, "party": {"type": "object", "properties": {
            "size": {"type": "integer", "exclusiveMinimum": 0, "maximum": 20},
            "names": {"type": "array", "items": {"type": "string"}, "maxItems": 4}}, "required": ["size"]},
        "time": {"type": "number", "minimum": 0, "maximum": 24}, "vegan": {"type": "boolean"}},
        "required": ["restaurant", "party", "time"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
        "required": ["query"]}}},
]
MARKERS = ["<|tool_call>", "<tool_call|>", '<|"|>']  # Gemma 4's call markers: special tokens of its tokenizer


def synthetic_tokenizer(vocab_size: int, seed: int = 0, specials: tuple = ()) -> PreTrainedTokenizerFast:
    """Specials, every printable ASCII character, then distinct random pieces of 2-8 characters (the last ids are
    `specials`, added as special tokens)."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz" * 4 + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "0123456789" * 2 + " " * 6 + \
        ".,:;\"'{}[]-_!?()/\\"
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>"])}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    while len(vocab) < vocab_size - len(specials):
        piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 8)))
        vocab.setdefault(piece, len(vocab))
    for token in specials:
        vocab[token] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>")


def median_time(fn, repeats: int, device) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def run(vocab_size: int, L: int, device, repeats: int, kind: str = "schema") -> None:
    tools = kind == "tools"
    tok = synthetic_tokenizer(vocab_size, specials=tuple(MARKERS) if tools else ())
    constraint = ToolCalls(TOOLS, tool_choice="required") if tools else JsonSchema(SCHEMA)
    start = time.perf_counter()
    automaton = compile_constraint(constraint, tok, vocab_size, [1], 0)
    compile_s = time.perf_counter() - start
    print(f"\nconstraint: {constraint.describe()}")
    automaton = automaton.to(device)
    S, C, E = automaton.num_states, automaton.num_classes, automaton.src.shape[0]
    print(f"\nvocab {vocab_size}: compiled in {compile_s:.1f} s (outlines-core Index + table + factorization); "
          f"S={S} states, C={C} token classes, E={E} allowed (state, class) pairs")
    dense = S * vocab_size * 4
    stored = sum(t.numel() * t.element_size() for t in (automaton.token_class, automaton.class_table, automaton.src,
                                                          automaton.cls, automaton.dst, automaton.class_token))
    print(f"  automaton storage: {mib(stored)} factorized (a dense int32 [S, V] table would be {mib(dense)})")
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(1, L, vocab_size, device=device, generator=g) * 3
    start_state = torch.tensor([automaton.initial], device=device)
    end_ok = automaton.accepting[None]

    def project():
        _, states, _ = constrained_path(logits, automaton, start_state, end_ok)
        logits.clone().masked_fill_(~allowed_mask(automaton, states), float("-inf"))

    dp = median_time(lambda: constrained_path(logits, automaton, start_state, end_ok), repeats, device)
    full = median_time(project, repeats, device)
    # what the pass holds besides the logits: class maxima and their tokens [B, L, C], back-pointers [B, L, S], one
    # block of class_maxima temporaries (~4M elements: fp32 values, bool hits, int64 picks), the [B, L, V] mask
    work = L * C * (4 + 8) + L * S * 8 + (1 << 22) * (4 + 1 + 8)
    print(f"  Viterbi per canvas (B=1, L={L}): {dp * 1e3:.1f} ms; with the canvas projection (mask of the logits): "
          f"{full * 1e3:.1f} ms; working memory about {mib(work)} (+ the [1, L, V] bool mask {mib(L * vocab_size)})")

    config = small_config(vocab_size, L)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(config).to(device).eval()
    randomize_(model)
    ids = torch.randint(4, vocab_size, (1, 32), device=device)
    with torch.no_grad():
        cache = model.new_cache()
        cache.reserve(32 + L)
        model.encode(ids, cache)
        canvas = torch.randint(0, vocab_size, (1, L), device=device)
        small = median_time(lambda: model.head(model.denoise(canvas, cache, None)), repeats, device)
        head = torch.nn.Linear(2816, vocab_size, bias=False, device=device)
        hidden = torch.randn(1, L, 2816, device=device)
        big_head = median_time(lambda: head(hidden), max(1, repeats // 2), device)
    print(f"  decoder pass, small model (hidden 256, 6 layers), head included: {small * 1e3:.1f} ms -> Viterbi = "
          f"{dp / small:.2f} x, with projection {full / small:.2f} x")
    print(f"  26B LM head alone (hidden 2816): {big_head * 1e3:.1f} ms -> Viterbi = {dp / big_head:.2f} x, with "
          f"projection {full / big_head:.2f} x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32768, 262144])
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--constraint", choices=["schema", "tools"], default="schema",
                        help="the nested JSON schema (default) or a 3-tool ToolCalls union")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, {device} ({name}), {torch.get_num_threads()} thread(s), canvas {args.canvas}")
    for vocab_size in args.vocabs:
        run(vocab_size, args.canvas, device, args.repeats, args.constraint)


if __name__ == "__main__":
    main()
