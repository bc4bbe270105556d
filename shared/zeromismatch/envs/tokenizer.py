"""One small tokenizer shared by every env, sized for tiny models.

Vocabulary: 4 control tokens (PAD=0, BOS=1, EOS=2, SEP=3), the tool/format markers the envs use
(``<calc>``, ``</calc>``, ``<result>``, ``</result>``, ``<answer>``, ``</answer>``, ``<error>``,
``</error>``, ``<fix>``, ``</fix>``, ``<act>``, ``</act>``, ``<obs>``, ``</obs>``), then one token per
character of printable ASCII plus newline. About 115 ids in all (well under 512).

Encoding is greedy: at each position a marker that starts there wins over single characters, so
``decode(encode(text)) == text`` for every text made of the allowed characters. Characters outside the
vocabulary raise ValueError naming the character; control tokens are never produced from text.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence

__all__ = ["MARKERS", "CharTokenizer", "default_tokenizer"]

CONTROL = ("<pad>", "<bos>", "<eos>", "<sep>")
MARKERS = (
    "<calc>", "</calc>", "<result>", "</result>", "<answer>", "</answer>", "<error>", "</error>",
    "<fix>", "</fix>", "<act>", "</act>", "<obs>", "</obs>",
)  # fmt: skip
CHARACTERS = tuple(sorted(set(string.printable) - set("\t\r\x0b\x0c")))  # printable ASCII + space + \n


class CharTokenizer:
    """Character-level tokenizer with whole-token markers for tool calls and env observations."""

    def __init__(self, markers: Sequence[str] = MARKERS, characters: Sequence[str] = CHARACTERS) -> None:
        if len(set(markers)) != len(markers) or len(set(characters)) != len(characters):
            raise ValueError("markers and characters must not repeat")
        self.itos: list[str] = [*CONTROL, *markers, *characters]
        if len(self.itos) > 512:
            raise ValueError(f"vocabulary has {len(self.itos)} tokens; tiny models expect at most 512")
        self.stoi: dict[str, int] = {token: index for index, token in enumerate(self.itos)}
        # longest first, so "</result>" is never cut into "<" + "/result>"-style pieces by a shorter marker
        self._markers = sorted(markers, key=len, reverse=True)
        self._characters = frozenset(characters)

    pad_id = 0
    bos_id = 1
    eos_id = 2
    sep_id = 3

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = [self.bos_id] if add_bos else []
        position = 0
        while position < len(text):
            if text[position] == "<":
                marker = next((m for m in self._markers if text.startswith(m, position)), None)
                if marker is not None:
                    ids.append(self.stoi[marker])
                    position += len(marker)
                    continue
            char = text[position]
            if char not in self._characters:
                raise ValueError(f"character {char!r} at position {position} is not in the vocabulary")
            ids.append(self.stoi[char])
            position += 1
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_control: bool = True) -> str:
        pieces = []
        for token_id in ids:
            token_id = int(token_id)
            if not 0 <= token_id < len(self.itos):
                raise ValueError(f"token id {token_id} is outside the vocabulary (size {len(self.itos)})")
            if token_id < len(CONTROL):
                if skip_control:
                    continue
            pieces.append(self.itos[token_id])
        return "".join(pieces)


_DEFAULT: CharTokenizer | None = None


def default_tokenizer() -> CharTokenizer:
    """The tokenizer every env's text is guaranteed to round-trip through."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = CharTokenizer()
    return _DEFAULT
