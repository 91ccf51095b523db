"""A 15-token character-level tokenizer for Sudoku, built offline with the `tokenizers` library.

Vocabulary (id: token)::

    0 <pad>   1 <eos>   2 <bos>   3 <unk>   4 .   5..13 1..9   14 |

Every character is one token, and decoding joins tokens without spaces. '|' separates the puzzle from the
solution and is registered as the `sep_token`, so `decode(..., skip_special_tokens=True)` drops it with the
other specials.

Special tokens are never added automatically: there is no post-processor, so `tokenizer(text)` returns exactly
one id per character whatever `add_special_tokens` says. `encode_puzzle` adds <bos> and '|' explicitly; a
training prompt is built in one visible place instead of depending on a tokenizer flag.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .puzzles import BLANK, DIGITS, parse_puzzle

PAD, EOS, BOS, UNK, SEP = "<pad>", "<eos>", "<bos>", "<unk>", "|"
VOCAB: dict[str, int] = {
    token: index for index, token in enumerate([PAD, EOS, BOS, UNK, BLANK, *DIGITS, SEP])
}  # 15 tokens


def sudoku_tokenizer() -> PreTrainedTokenizerFast:
    """Return the Sudoku tokenizer (see the module docstring for the vocabulary).

    Returns:
        A fast tokenizer with pad/eos/bos/unk/sep tokens set; it round-trips through `save_pretrained` and
        `AutoTokenizer.from_pretrained`.
    """
    backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one token per character
    backend.decoder = decoders.Fuse()  # join tokens without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        sep_token=SEP,
    )


def encode_puzzle(tokenizer: PreTrainedTokenizerFast, puzzle: str) -> list[int]:
    """Return the prompt ids for `puzzle`: <bos>, its 81 cells, then '|'.

    Args:
        tokenizer: from `sudoku_tokenizer`.
        puzzle: 81 characters, see `parse_puzzle`; '0' blanks become '.'.

    Returns:
        83 ids.
    """
    cells = tokenizer.encode(parse_puzzle(puzzle), add_special_tokens=False)  # [81]
    return [tokenizer.bos_token_id, *cells, tokenizer.sep_token_id]


def decode_solution(tokenizer: PreTrainedTokenizerFast, ids: Sequence[int]) -> str:
    """Return the grid written by generated `ids`.

    Args:
        tokenizer: from `sudoku_tokenizer`.
        ids: the generated tokens only (not the prompt), e.g. a denoised canvas.

    Returns:
        The first 81 characters after dropping <pad>, <eos>, <bos>, <unk> and '|'. Shorter when fewer remain,
        so `is_solved` rejects it rather than this function raising.
    """
    return tokenizer.decode(list(ids), skip_special_tokens=True)[:81]
