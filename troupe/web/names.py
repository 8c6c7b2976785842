"""The rules of the name a session goes by ("who is connected", the Runs list's By
column): the teacher reads it to know who ran what, so no name may pass for someone
else's.

A name is at most ``NAME_MAX`` characters of text that shows as what it is: no control
characters, no bidi overrides or isolates (which reorder what a page or a terminal shows
around them), no zero-width or other invisible format characters (``Ann\u200b`` reads as
``Ann``). It is not one of the labels that mean the teacher (``server``, ``teacher``, and
``server token``, which the runs of the server's own token show) unless the session is
the teacher's, and no other live session goes by it: names are compared after NFKC (a
full-width ``ｔｅａｃｈｅｒ`` is ``teacher``), case folding and runs of spaces made one.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from troupe.protocol.errors import InvalidRequest, StateConflict

NAME_MAX = 40
# What a run submitted with the server's own token shows as its submitter, and the words
# that would pass for the teacher.
RESERVED = ("server", "server token", "teacher")
# Control characters, format characters (bidi overrides and isolates, zero-width spaces
# and joiners, the byte-order mark, soft hyphens), line and paragraph separators, halves
# of surrogate pairs.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
# The rest of Unicode's default-ignorable code points, which a page or a terminal draws as
# nothing though their category is a mark or a letter: the combining grapheme joiner,
# the Hangul fillers, the Mongolian and Khmer invisible vowels, the variation selectors
# (``ann\ufe0f`` reads as ``ann``), and the reserved ranges Unicode keeps ignorable.
_IGNORABLE = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2065, 0x2065),
              (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0xE0000, 0xE0FFF))
POINTER = "/name"


def folded(name: str) -> str:
    """The form two names are compared in."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def _ignorable(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in _IGNORABLE)


def check_name(name: str, teacher: bool, taken: Iterable[str]) -> str:
    """The name as it will be shown (trimmed), or a 400 saying what is wrong with it
    (``name_hidden_character``, ``name_too_long``, ``name_reserved``), or a 409
    ``name_taken`` when a session of ``taken`` goes by it. ``teacher``: the teacher's
    own session, which may call itself the teacher."""
    shown = name.strip()
    for char in shown:
        if unicodedata.category(char) in _HIDDEN or _ignorable(char):
            what = unicodedata.name(char, "a control character")
            raise InvalidRequest(f"a name may not hold U+{ord(char):04X} ({what}): a control, bidi or zero-width "
                                 "character makes a name show as something else", pointer=POINTER,
                                 code="name_hidden_character")
    if len(shown) > NAME_MAX:
        raise InvalidRequest(f"a name is at most {NAME_MAX} characters; this one has {len(shown)}", pointer=POINTER,
                             code="name_too_long")
    mine = folded(shown)
    if not teacher and mine in {folded(word) for word in RESERVED}:
        raise InvalidRequest(f"{shown!r} is what the teacher goes by ({', '.join(RESERVED)}); choose your own name",
                             pointer=POINTER, code="name_reserved")
    if any(folded(other) == mine for other in taken):
        raise StateConflict(f"another session connected now goes by {shown!r}; choose another name", pointer=POINTER,
                            code="name_taken")
    return shown
