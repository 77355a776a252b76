"""What text people may type into names and descriptions: visible characters, nothing that hides.

The patterns are regular expressions that JSON Schema (the OpenAPI spec), pydantic and Python's
`re` all read alike: character classes of `\\uXXXX` escapes, no Unicode property classes.

Refused everywhere: C0 and C1 control characters, and the invisible characters that change how text
around them is shown or read: bidirectional overrides and isolates (a name written with U+202E shows
reversed in every table an admin reads), line and paragraph separators (U+2028, U+2029: a new line in
a one-line field), zero-width spaces, word joiners, the byte-order mark, soft hyphens. Zero-width
joiners stay (emoji sequences and some scripts need them). A one-line field also cannot start or
end with a blank of any kind, so a name that is only a no-break space is no name.
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
# Blanks: the space, the no-break spaces and the typographic spaces.
_BLANK = r"\x20\xa0\u1680\u2000-\u200a\u202f\u205f\u3000"

# One line of visible text, no blank at either end.
LINE = rf"^[^{_HIDDEN}{_BLANK}]([^{_HIDDEN}]*[^{_HIDDEN}{_BLANK}])?$"
# Free text (lines and tabs allowed) that starts with something visible.
TEXT = rf"^[^{_HIDDEN}{_BLANK}\t\n\r][^{_HIDDEN_IN_TEXT}]*$"
# Nothing hidden at all (what a URL's path and query may hold: no identifier or parameter has one).
NO_HIDDEN = rf"^[^{_HIDDEN}]*$"
_ANY_HIDDEN = re.compile(rf"[{_HIDDEN}]")


def has_hidden(value: str) -> bool:
    """Whether `value` holds a control or invisible character (see the module's docstring)."""
    return _ANY_HIDDEN.search(value) is not None


# Free text that may be empty (a description).
OPTIONAL_TEXT = rf"^([^{_HIDDEN}{_BLANK}\t\n\r][^{_HIDDEN_IN_TEXT}]*)?$"

_LINE = re.compile(LINE)


def is_line(value: str) -> bool:
    """Whether `value` is one line of visible text as `LINE` says."""
    return _LINE.fullmatch(value) is not None
