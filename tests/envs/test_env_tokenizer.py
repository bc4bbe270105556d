"""The shared tokenizer: small vocabulary, exact round trips, markers as single tokens, clear errors."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.envs.tokenizer import MARKERS, CharTokenizer, default_tokenizer

ALLOWED = sorted(set(string.printable) - set("\t\r\x0b\x0c"))


def test_vocabulary_is_small_with_fixed_special_ids():
    tokenizer = default_tokenizer()
    assert tokenizer.vocab_size <= 512
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
    assert tokenizer.itos[:3] == ["<pad>", "<bos>", "<eos>"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(ALLOWED), st.sampled_from(MARKERS)), max_size=40))
def test_round_trip(pieces):
    text = "".join(pieces)
    tokenizer = default_tokenizer()
    ids = tokenizer.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert tokenizer.decode(ids) == text


def test_markers_are_single_tokens_and_control_text_is_characters():
    tokenizer = default_tokenizer()
    assert len(tokenizer.encode("<calc>1+2</calc>")) == 5
    assert len(tokenizer.encode("</result>")) == 1
    # the text "<eos>" is five characters, never the control token
    assert tokenizer.eos_id not in tokenizer.encode("<eos>")
    assert tokenizer.decode([tokenizer.pad_id, tokenizer.eos_id], skip_control=False) == "<pad><eos>"


def test_bad_input_errors():
    tokenizer = CharTokenizer()
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tokenizer.encode("caf\u00e9")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([10_000])
    with pytest.raises(TypeError, match="text must be str"):
        tokenizer.encode(b"bytes")
    with pytest.raises(ValueError, match="repeat"):
        CharTokenizer(markers=("<a>", "<a>"))
