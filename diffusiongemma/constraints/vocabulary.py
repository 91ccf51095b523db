"""The bytes each token id spells, read from a Hugging Face tokenizer: what the automaton walks over.

An answer's text is the concatenation of its tokens' bytes. Three spellings are understood, found from the fast
tokenizer's decoder: byte-level BPE (GPT-2's byte-to-unicode alphabet), SentencePiece (`▁` is a space, `<0xNN>` byte
fallback, as Gemma's tokenizer decodes), and plain strings (every other decoder). Special tokens (BOS, EOS, pad,
unk, chat markers) spell nothing: the automaton never allows them inside an answer.
"""

import json

from .errors import ConstraintError

SPIECE_SPACE = "\u2581"


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, inverted: character -> byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def decoder_kinds(tokenizer) -> set[str]:
    """The decoder types of a fast tokenizer (flattening `Sequence`); empty for a slow one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return {"SentencePiece"}  # slow tokenizers here are SentencePiece models
    decoder = json.loads(backend.to_str()).get("decoder")
    kinds, todo = set(), [decoder]
    while todo:
        node = todo.pop()
        if not node:
            continue
        kinds.add(node.get("type"))
        todo += node.get("decoders", [])
        if node.get("type") == "Replace" and node.get("pattern", {}).get("String") == SPIECE_SPACE:
            kinds.add("SentencePiece")
    if "Metaspace" in kinds:
        kinds.add("SentencePiece")
    return kinds


def spell(token: str, kinds: set[str], alphabet: dict[str, int] | None) -> bytes | None:
    """One token's bytes under the tokenizer's spelling, or None when it spells nothing."""
    if "ByteFallback" in kinds or "SentencePiece" in kinds:
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                return bytes([int(token[3:5], 16)])
            except ValueError:
                pass
    if alphabet is not None and all(c in alphabet for c in token):
        return bytes(alphabet[c] for c in token)
    if "SentencePiece" in kinds:
        token = token.replace(SPIECE_SPACE, " ")
    data = token.encode("utf-8")
    return data or None


def token_bytes(tokenizer) -> list[bytes | None]:
    """[len(tokenizer)] the bytes of every token id, None for special tokens and ids the tokenizer does not use.

    Raises:
        ConstraintError: the tokenizer spells no token at all.
    """
    vocab = tokenizer.get_vocab()  # token -> id, added tokens included
    size = max(vocab.values()) + 1 if vocab else 0
    special = set(tokenizer.all_special_ids)
    for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            special.add(token_id)
    kinds = decoder_kinds(tokenizer)
    alphabet = byte_level_alphabet() if "ByteLevel" in kinds else None
    spelled: list[bytes | None] = [None] * size
    for token, token_id in vocab.items():
        if token_id not in special:
            spelled[token_id] = spell(token, kinds, alphabet)
    if not any(s is not None for s in spelled):
        raise ConstraintError("the tokenizer spells no token (all are special): it cannot write a constrained answer")
    return spelled


DECODE_SAMPLE = 64  # tokens whose joined text `check_decode` compares with `decode`


def check_decode(tokenizer, spelled: list[bytes | None], description: str) -> None:
    """Refuse a tokenizer whose `decode` is not the concatenation of its tokens' text.

    The automaton accepts token sequences by the text they spell; the user receives `tokenizer.decode(...)`. A
    tokenizer without a decoder (a `WordLevel` model, say) has transformers join its pieces with spaces, so an
    answer the automaton accepts as `{"id"` would reach the user as `{ " i d "`. One decode of a few dozen tokens,
    spread over the vocabulary, tells.

    Raises:
        ConstraintError: the decoded text differs from the joined pieces, naming both.
    """
    usable = []
    for token_id, data in enumerate(spelled):
        if data is not None:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:  # a byte-fallback piece: only whole characters are compared
                continue
            usable.append(token_id)
    sample = usable[:: max(1, len(usable) // DECODE_SAMPLE)][:DECODE_SAMPLE]
    joined = b"".join(spelled[t] for t in sample).decode("utf-8")
    decoded = tokenizer.decode(sample, skip_special_tokens=True)  # with its defaults, as users decode
    if decoded != joined:
        at = next((i for i, (a, b) in enumerate(zip(decoded, joined)) if a != b), min(len(decoded), len(joined)))
        raise ConstraintError(
            f"{description}: this tokenizer's decode() is not the concatenation of its tokens' text (it decodes "
            f"token ids {sample[:8]}... to {decoded[max(0, at - 10) : at + 20]!r} where the tokens spell "
            f"{joined[max(0, at - 10) : at + 20]!r}), so a constrained answer would not match as text; give the "
            f"tokenizer a decoder that joins its pieces (e.g. tokenizers' `decoders.Fuse()`)")
