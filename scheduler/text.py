"""What text people may type into names and descriptions: visible characters, nothing that hides.

The patterns are regular expressions that JSON Schema (the OpenAPI spec), pydantic and Python's
`re` all read alike: character classes of `\\uXXXX` escapes, no Unicode property classes.

Refused everywhere: C0 and C1 control characters, and the invisible characters that change how text
around them is shown or read: bidirectional overrides and isolates (a name written with U+202E shows
reversed in every table an admin reads), line and paragraph separators (U+2028, U+2029: a new line in
a one-line field), zero-width spaces, word joiners, the byte-order mark, soft hyphens. Zero-width
joiners stay (emoji sequences and some scripts need them). A one-line field also cannot start or
end with a blank of any kind, so a name that is only a no-break space is no name.

A name needs a visible character, and text starts with one: neither may start with a character that
shows nothing by itself (a combining mark, the combining grapheme joiner U+034F, a variation selector,
a tag character, a zero-width joiner), and the blank-looking fillers (Hangul fillers such as U+3164,
the blank Braille pattern U+2800, Khmer's invisible vowels) count as blanks, so a name made only of
them (a job named U+3164) is refused. Inside a name they all stay: scripts and emoji need them.
"""

from __future__ import annotations

import re

# Controls (C0, DEL, C1) and invisible format characters.
_HIDDEN = (
    r"\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
)
# The same, less tab, line feed and carriage return (free text may have lines).
_HIDDEN_IN_TEXT = (
    r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e"
    r"\u2060-\u206f\ufeff\ufff9-\ufffb"
)
# Blanks: the space, the no-break spaces and the typographic spaces; the fillers that show as blanks
# (Hangul fillers, Khmer's invisible vowels, the blank Braille pattern).
_BLANK = r"\x20\xa0\u1680\u2000-\u200a\u202f\u205f\u3000\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0"
# What shows nothing by itself, so cannot start a name or a text: combining marks (the main blocks,
# with U+034F), zero-width joiners, variation selectors, and (literal astral characters, which JSON
# Schema's `\u` escapes cannot name) tag characters and the variation selectors supplement.
_NOT_FIRST = (
    r"\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u05bf\u05c1\u05c2\u05c4\u05c5\u05c7\u0610-\u061a"
    r"\u064b-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7\u06e8\u06ea-\u06ed\u0711\u0730-\u074a"
    r"\u0900-\u0903\u093a-\u094f\u0951-\u0957\u0962\u0963\u0e31\u0e34-\u0e3a\u0e47-\u0e4e"
    r"\u1ab0-\u1aff\u1dc0-\u1dff\u200c\u200d\u20d0-\u20ff\u302a-\u302f\u3099\u309a\ufe00-\ufe0f\ufe20-\ufe2f"
    "\U000e0000-\U000e007f\U000e0100-\U000e01ef"
)

# One line of visible text, no blank at either end.
LINE = rf"^[^{_HIDDEN}{_BLANK}{_NOT_FIRST}]([^{_HIDDEN}]*[^{_HIDDEN}{_BLANK}])?$"
# Free text (lines and tabs allowed) that starts with something visible.
TEXT = rf"^[^{_HIDDEN}{_BLANK}{_NOT_FIRST}\t\n\r][^{_HIDDEN_IN_TEXT}]*$"
# Nothing hidden at all (what a URL's path and query may hold: no identifier or parameter has one).
NO_HIDDEN = rf"^[^{_HIDDEN}]*$"
_ANY_HIDDEN = re.compile(rf"[{_HIDDEN}]")


def has_hidden(value: str) -> bool:
    """Whether `value` holds a control or invisible character (see the module's docstring)."""
    return _ANY_HIDDEN.search(value) is not None


# Free text that may be empty (a description).
OPTIONAL_TEXT = rf"^([^{_HIDDEN}{_BLANK}{_NOT_FIRST}\t\n\r][^{_HIDDEN_IN_TEXT}]*)?$"

_LINE = re.compile(LINE)


def is_line(value: str) -> bool:
    """Whether `value` is one line of visible text as `LINE` says."""
    return _LINE.fullmatch(value) is not None
