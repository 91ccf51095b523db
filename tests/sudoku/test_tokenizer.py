"""Tests for diffusiongemma/sudoku/tokenizer.py."""

import pytest
from transformers import AutoTokenizer

from diffusiongemma.sudoku.tokenizer import decode_solution, encode_puzzle, sudoku_tokenizer

PUZZLE = "8..........36......7..9.2...5...7.......457.....1...3...1....68..85...1..9....4.."
SOLUTION = "812753649943682175675491283154237896369845721287169534521974368438526917796318452"
EXPECTED_VOCAB = {
    "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, ".": 4,
    "1": 5, "2": 6, "3": 7, "4": 8, "5": 9, "6": 10, "7": 11, "8": 12, "9": 13, "|": 14,
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return sudoku_tokenizer()


def test_vocabulary_is_exact(tokenizer):
    assert tokenizer.get_vocab() == EXPECTED_VOCAB
    assert len(tokenizer) == 15


def test_special_token_ids(tokenizer):
    ids = (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id)
    assert ids == (0, 1, 2, 3)
    assert tokenizer.sep_token_id == 14


def test_one_token_per_character_and_no_specials_added(tokenizer):
    # "53.|" -> '5'=9, '3'=7, '.'=4, '|'=14; no <bos>/<eos> even with the default add_special_tokens=True.
    assert tokenizer("53.|").input_ids == [9, 7, 4, 14]
    assert tokenizer("x").input_ids == [3]  # unknown character -> <unk>


def test_decode_joins_without_spaces(tokenizer):
    assert tokenizer.decode([5, 6, 4, 13]) == "12.9"


def test_encode_puzzle_is_bos_cells_sep(tokenizer):
    ids = encode_puzzle(tokenizer, PUZZLE)
    assert len(ids) == 83
    assert ids[0] == 2 and ids[-1] == 14
    assert ids[1:4] == [12, 4, 4]  # "8.."
    assert encode_puzzle(tokenizer, PUZZLE.replace(".", "0")) == ids


def test_encode_puzzle_rejects_bad_puzzle(tokenizer):
    with pytest.raises(ValueError, match="got 80 characters"):
        encode_puzzle(tokenizer, PUZZLE[:80])


def test_round_trips_puzzle_and_solution(tokenizer):
    assert decode_solution(tokenizer, encode_puzzle(tokenizer, PUZZLE)) == PUZZLE
    assert decode_solution(tokenizer, tokenizer.encode(SOLUTION)) == SOLUTION


def test_decode_solution_strips_specials_and_keeps_81(tokenizer):
    # <bos> '|' <eos> <pad> are dropped wherever they sit; digits past the 81st are cut.
    ids = [2, 14] + tokenizer.encode(SOLUTION[:40]) + [0] + tokenizer.encode(SOLUTION[40:] + "123") + [1, 0, 0]
    assert decode_solution(tokenizer, ids) == SOLUTION


def test_decode_solution_short_output_stays_short(tokenizer):
    assert decode_solution(tokenizer, [5, 6, 1, 0]) == "12"


def test_save_and_load_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.get_vocab() == EXPECTED_VOCAB
    assert loaded.all_special_ids == tokenizer.all_special_ids
    assert (loaded.pad_token, loaded.eos_token, loaded.bos_token, loaded.unk_token, loaded.sep_token) == (
        "<pad>", "<eos>", "<bos>", "<unk>", "|",
    )  # fmt: skip
    ids = encode_puzzle(loaded, PUZZLE)
    assert ids == encode_puzzle(tokenizer, PUZZLE)
    assert loaded("53.").input_ids == [9, 7, 4]
    assert decode_solution(loaded, ids) == PUZZLE
