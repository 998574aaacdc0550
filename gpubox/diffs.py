"""Unified diffs for plans: what a write would change, in the a/ b/ form `git diff` uses."""

from __future__ import annotations

import difflib


def unified(path: str, old: str | None, new: str | None) -> str:
    """Diff of a file's text; None means absent (shown against /dev/null). Empty when equal."""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    return "".join(
        difflib.unified_diff(
            a, b, "/dev/null" if old is None else f"a{path}", "/dev/null" if new is None else f"b{path}"
        )
    )
