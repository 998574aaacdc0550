"""`--skip` / `--only`: which steps of a pipeline run.

A word names one whole step (`container`, `pcie-mrrs`) or a group an area declares (`lxc`,
`tune`, `stage`: gpubox.areas.step_groups); words may be repeated or comma-separated. There is no
prefix matching, so `--only container` never selects `container-config`; a word that is neither a
step nor a group is bad input (exit 2) that names the closest known words.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Mapping, Sequence

from .errors import GpuboxError


def words(given: Iterable[str]) -> list[str]:
    """The words of repeated and comma-separated options, in order, blanks dropped."""
    return [w.strip() for g in given for w in str(g).split(",") if w.strip()]


def _suggest(word: str, known: Sequence[str]) -> list[str]:
    close = difflib.get_close_matches(word, known, n=3, cutoff=0.6)
    parts = [k for k in known if word in k.split("-") and k not in close]  # `mrrs` -> pcie-mrrs
    return close + parts[: max(0, 3 - len(close))]


def step_names(given: Iterable[str], steps: Sequence[str], groups: Mapping[str, Sequence[str]]) -> set[str]:
    """The step names the words select: a step by its name, a group by its steps."""
    known = list(dict.fromkeys([*steps, *groups]))
    out: set[str] = set()
    for w in words(given):
        if w in groups:
            out.update(groups[w])
        elif w in steps or any(w in members for members in groups.values()):
            out.add(w)
        else:
            hint = _suggest(w, known)
            raise GpuboxError(
                f"unknown step or group {w!r}" + (f": did you mean {' or '.join(hint)}?" if hint else ""),
                f"steps: {', '.join(steps)}; groups: {', '.join(groups)}",
            )
    return out


def select(
    steps: Sequence[str],
    groups: Mapping[str, Sequence[str]],
    skip: Iterable[str] = (),
    only: Iterable[str] = (),
) -> list[str]:
    """The names of `steps` (in their order) that `--only` keeps and `--skip` does not drop."""
    sk = step_names(skip, steps, groups)
    on = step_names(only, steps, groups)
    only_given = bool(words(only))
    return [s for s in steps if s not in sk and (not only_given or s in on)]
