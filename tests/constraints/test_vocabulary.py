"""The bytes each token spells: plain strings, SentencePiece (`▁`, `<0xNN>`) and byte-level BPE; specials none."""

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from conftest import tiny_tokenizer

from diffusiongemma.constraints.vocabulary import byte_level_alphabet, decoder_kinds, spell, token_bytes


def test_tiny_tokenizer_spells_its_characters_and_no_special():
    tok = tiny_tokenizer()
    spelled = token_bytes(tok)
    assert len(spelled) == 128
    assert spelled[:4] == [None] * 4  # <pad> <eos> <bos> <unk>
    assert spelled[tok.convert_tokens_to_ids("a")] == b"a" and spelled[4] == b" "
    assert spelled[100] == b"<x100>"  # a filler token decodes to its own text
    assert all(tok.decode([i]).encode() == spelled[i] for i in range(4, 128))


def test_sentencepiece_spelling():
    kinds = {"SentencePiece", "ByteFallback"}
    assert spell("\u2581hello", kinds, None) == b" hello"
    assert spell("<0xE2>", kinds, None) == b"\xe2"
    assert spell("<0xZZ>", kinds, None) == b"<0xZZ>"


def test_gemma_like_decoder_is_read_as_sentencepiece():
    vocab = {"<pad>": 0, "<eos>": 1, "\u2581a": 2, "b": 3, "<0x41>": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    assert "SentencePiece" in decoder_kinds(tok)
    assert token_bytes(tok) == [None, None, b" a", b"b", b"A"]
    assert tok.decode([2, 3, 4]) == " abA"


def test_byte_level_alphabet_round_trips():
    alphabet = byte_level_alphabet()
    assert len(alphabet) == 256 and sorted(alphabet.values()) == list(range(256))
    assert spell("\u0120hi", {"ByteLevel"}, alphabet) == b" hi"  # GPT-2's Ġ is a space


def test_a_tokenizer_whose_decode_is_not_its_pieces_is_refused():
    # a WordLevel model without a decoder: transformers joins the pieces with spaces, `{"a"` would reach the user as
    # `{ " a "`
    import pytest

    from diffusiongemma import ConstraintError, JsonSchema
    from diffusiongemma.constraints import compile_constraint

    spaced = tiny_tokenizer()
    spaced.backend_tokenizer.decoder = None
    assert spaced.decode(spaced.convert_tokens_to_ids(list('{"a"'))) == '{ " a "'
    with pytest.raises(ConstraintError, match=r"decode\(\) is not the concatenation of its tokens' text .*"
                                              r"decoders.Fuse"):
        compile_constraint(JsonSchema({"type": "object"}), spaced, 128, [1], 0)
    compile_constraint(JsonSchema({"type": "boolean"}), tiny_tokenizer(), 128, [1], 0)  # Fuse: accepted


def test_the_cache_tells_tokenizers_apart_by_their_decoder():
    # same vocabulary, one without a decoder: its refusal is not served to the other from the cache
    import pytest

    from diffusiongemma import ConstraintError, Regex
    from diffusiongemma.constraints import compile_constraint

    spaced = tiny_tokenizer()
    spaced.backend_tokenizer.decoder = None
    with pytest.raises(ConstraintError, match="not the concatenation"):
        compile_constraint(Regex("k[0-9]k"), spaced, 128, [1], 0)
    compile_constraint(Regex("k[0-9]k"), tiny_tokenizer(), 128, [1], 0)
