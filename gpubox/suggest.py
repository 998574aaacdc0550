"""Did-you-mean for names a person types (commands, boxes, faults, NCCL variables): one rule, so
every typo gets the same kind of hint.

difflib's ratio, case-insensitive; a choice the word is the start of ranks first (`ct2` -> ct200).
Hand-written rather than a library's: the standard library's difflib does the matching, this only
orders and words the answer."""

from __future__ import annotations

import difflib


def close(word: str, choices, *, n: int = 2, cutoff: float = 0.6) -> list[str]:
    """Up to n choices close to word, best first, in their own spelling."""
    by_upper = {str(c).upper(): str(c) for c in choices}
    w = word.upper()
    prefixed = [by_upper[c] for c in sorted(by_upper) if c.startswith(w) and c != w and w]
    near = [by_upper[c] for c in difflib.get_close_matches(w, list(by_upper), n=n, cutoff=cutoff)]
    return list(dict.fromkeys(prefixed + near))[:n]


def hint(word: str, choices, **kw) -> str:
    """' Did you mean 'a' or 'b'?' (with the leading space), or '' when nothing is close."""
    hits = close(word, choices, **kw)
    return f" Did you mean {' or '.join(repr(h) for h in hits)}?" if hits else ""


def with_hint(message: str, word: str, choices, **kw) -> str:
    """message, plus '. Did you mean ...?' when something is close (message unchanged otherwise)."""
    h = hint(word, choices, **kw)
    return f"{message}.{h}" if h else message
