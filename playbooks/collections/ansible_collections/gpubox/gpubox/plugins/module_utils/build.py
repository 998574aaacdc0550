# -*- coding: utf-8 -*-
# Copyright: gpubox contributors
# Apache License 2.0 (see LICENSE in the collection)
"""The identity of the gpubox build a checkout makes, and where its wheel is cached.

A build is named ``<version>+<digest>``: the version in pyproject.toml and the first 12 hex digits of
a SHA-256 over every file the wheel is made of (pyproject.toml, README.md, LICENSE and the package
folders pyproject's package-dir names). Two checkouts with the same files make the same build, an
edit anywhere in the library makes a new one, and an edit in docs/ or tests/ does not. The wheel of
a build is kept in ``<cache>/<build>/`` on the control node, so it is built once per build.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import re

SKIP_DIRS = frozenset(("__pycache__", "build", "dist", "tests"))
TOP_FILES = ("pyproject.toml", "README.md", "LICENSE")
MARKER = ".gpubox-build"  # in the venv: the build installed there
DEFAULT_CACHE = "~/.cache/gpubox/wheels"


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def version_of(src):
    text = _read(os.path.join(src, "pyproject.toml")).decode("utf-8", "replace")
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise ValueError("%s/pyproject.toml has no version" % src)
    return m.group(1)


def package_dirs(src):
    """The folders pyproject.toml's package-dir maps (gpubox, bench, hwtune, provision)."""
    text = _read(os.path.join(src, "pyproject.toml")).decode("utf-8", "replace")
    m = re.search(r"^package-dir\s*=\s*\{([^}]*)\}", text, re.M)
    found = sorted(set(re.findall(r'=\s*"([^"]+)"', m.group(1)))) if m else []
    return [d for d in found if os.path.isdir(os.path.join(src, d))] or ["gpubox"]


def build_id(src):
    """``<version>+<digest>`` of the checkout SRC (see the module docstring)."""
    h = hashlib.sha256()
    files = [f for f in TOP_FILES if os.path.isfile(os.path.join(src, f))]
    for top in package_dirs(src):
        for dirpath, dirnames, filenames in os.walk(os.path.join(src, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith((".pyc", ".partial")) or name.startswith("."):
                    continue
                files.append(os.path.relpath(os.path.join(dirpath, name), src))
    for rel in sorted(files):
        h.update(rel.encode("utf-8") + b"\0")
        h.update(hashlib.sha256(_read(os.path.join(src, rel))).digest())
    return "%s+%s" % (version_of(src), h.hexdigest()[:12])


def cached_wheel(cache, build):
    """The cached wheel of BUILD, or None."""
    folder = os.path.join(os.path.expanduser(cache), build)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".whl"))
    except OSError:
        return None
    return os.path.join(folder, names[0]) if len(names) == 1 else None
