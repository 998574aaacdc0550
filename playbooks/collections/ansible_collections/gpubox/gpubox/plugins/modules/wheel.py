#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpubox contributors
# Apache License 2.0 (see LICENSE in the collection)
"""Ansible module: the gpubox wheel of a checkout, built once per build on the control node."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: wheel
short_description: Build the gpubox wheel of a checkout once per build, into a cache on the control node
description:
  - Names the checkout's build C(<version>+<digest>) (a SHA-256 over the files the wheel is made of,
    so any edit of the library is a new build) and returns the wheel of that build from
    O(cache)C(/<build>/), building it only when the cache has none.
  - The build runs C(pip wheel --no-deps --no-build-isolation) on a copy of the checkout (without .git,
    tests, caches and build outputs), so the checkout gets no build/ or egg-info debris.
  - C(changed) when it built the wheel (a new file in the cache on the control node); in check mode
    nothing is built and C(changed) says whether a real run would build.
version_added: "0.1.0"
author: gpubox contributors (@gpubox)
options:
  src:
    description: The gpubox checkout (the directory holding pyproject.toml).
    type: path
    required: true
  cache:
    description: Wheel cache on the control node; each build's wheel goes into its own folder there.
    type: path
    default: ~/.cache/gpubox/wheels
  build_isolation:
    description: Let pip fetch the build backend in an isolated environment (needs an index).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Builds nothing; reports whether a real run would build.
  diff_mode:
    support: none
    description: No diff; the result is a file in the control node's cache.
"""

EXAMPLES = r"""
- name: The gpubox wheel of this checkout
  gpubox.gpubox.wheel:
    src: "{{ playbook_dir }}/.."
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
build:
  description: The build, C(<version>+<digest>); the install role writes it into the venv it installs.
  type: str
  returned: always
  sample: 0.1.0+3f2a9c01be77
path:
  description: The wheel on the control node (in check mode, where it would be).
  type: str
  returned: always
filename:
  description: Its file name (empty in check mode when it is not built yet).
  type: str
  returned: always
"""

import os
import shutil
import subprocess
import sys
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpubox.gpubox.plugins.module_utils.build import build_id, cached_wheel

IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", "tests",
                                ".venv", "venv", ".pytest_cache", "results", "out", ".whl", "benchmarks",
                                "playbooks", "inventory", "docs", "*.partial", ".*")


def build_into(module, src, folder, isolation):
    """pip wheel of a copy of SRC, moved into FOLDER (atomically: a half-written wheel is never seen)."""
    with tempfile.TemporaryDirectory(prefix="gpubox-wheel-") as tmp:
        tree = os.path.join(tmp, "src")
        shutil.copytree(src, tree, ignore=IGNORE, symlinks=False)
        out = os.path.join(tmp, "out")
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
                "-w", out, tree]
        if not isolation:
            argv.insert(4, "--no-build-isolation")
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp, check=False)
        if proc.returncode != 0:
            module.fail_json(msg="building the gpubox wheel failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1],
                             cmd=argv, stderr=proc.stderr, stdout=proc.stdout, rc=proc.returncode)
        built = [f for f in os.listdir(out) if f.endswith(".whl")]
        if len(built) != 1:
            module.fail_json(msg="expected one wheel, pip wrote %s" % built)
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
        shutil.copyfile(os.path.join(out, built[0]), os.path.join(staging, built[0]))
        try:
            os.rename(staging, folder)
        except OSError:  # another run built it meanwhile: keep theirs
            shutil.rmtree(staging, ignore_errors=True)
        return cached_wheel(os.path.dirname(folder), os.path.basename(folder))


def main():
    module = AnsibleModule(
        argument_spec=dict(src=dict(type="path", required=True),
                           cache=dict(type="path", default="~/.cache/gpubox/wheels"),
                           build_isolation=dict(type="bool", default=False)),
        supports_check_mode=True,
    )
    src, cache = module.params["src"], module.params["cache"]
    if not os.path.isfile(os.path.join(src, "pyproject.toml")):
        module.fail_json(msg="%s has no pyproject.toml (point gpubox_source at the gpubox checkout)" % src)
    build = build_id(src)
    folder = os.path.join(cache, build)
    path = cached_wheel(cache, build)
    if path:
        module.exit_json(changed=False, build=build, path=path, filename=os.path.basename(path))
    if module.check_mode:
        module.exit_json(changed=True, build=build, path=folder, filename="")
    path = build_into(module, src, folder, module.params["build_isolation"])
    if not path:
        module.fail_json(msg="no wheel in %s after the build" % folder, build=build)
    module.exit_json(changed=True, build=build, path=path, filename=os.path.basename(path))


if __name__ == "__main__":
    main()
