#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: build the gpubox wheel from a checkout on the control node.

Why a module and not `command: pip wheel`: a rebuilt wheel differs byte for byte (zip timestamps)
even when no file in it changed, which would make every `copy` to the managed hosts "changed".
This module compares the new wheel's *contents* with the wheel already in DEST and keeps the old
file when they are equal, so a second run changes nothing, anywhere.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: wheel
short_description: Build the gpubox wheel from a checkout, keeping the old file when its contents did not change
description:
  - Copies the checkout (without .git, tests, caches and build outputs) to a temporary directory
    and runs C(pip wheel --no-deps --no-build-isolation) there, so the checkout gets no build/ or
    egg-info debris.
  - C(changed) only when the wheel's contents differ from the one already in O(dest).
version_added: "0.1.0"
author: gpubox contributors (@gpubox)
options:
  src:
    description: The gpubox checkout (the directory holding pyproject.toml).
    type: path
    required: true
  dest:
    description: Directory the wheel is written to.
    type: path
    required: true
  build_isolation:
    description: Let pip fetch the build backend in an isolated environment (needs an index).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Build the gpubox wheel
  gpubox.gpubox.wheel:
    src: "{{ playbook_dir }}/.."
    dest: "{{ playbook_dir }}/../.whl"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
path:
  description: Path of the wheel on the control node.
  type: str
  returned: success
filename:
  description: Its file name.
  type: str
  returned: success
content_sha256:
  description: SHA-256 over the wheel's member names and contents (independent of zip timestamps).
  type: str
  returned: success
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from ansible.module_utils.basic import AnsibleModule

IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", "tests",
                                ".venv", "venv", ".pytest_cache", "results", "out", ".whl", "benchmarks",
                                "playbooks", "inventory", "*.partial")


def content_digest(path):
    """SHA-256 of (name, content) of every member, sorted: equal for equal contents."""
    h = hashlib.sha256()
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            h.update(name.encode() + b"\0")
            h.update(hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()


def main():
    module = AnsibleModule(
        argument_spec=dict(src=dict(type="path", required=True), dest=dict(type="path", required=True),
                           build_isolation=dict(type="bool", default=False)),
        supports_check_mode=True,
    )
    src, dest = module.params["src"], module.params["dest"]
    if not os.path.isfile(os.path.join(src, "pyproject.toml")):
        module.fail_json(msg=f"{src} has no pyproject.toml (point gpubox_source at the gpubox checkout)")
    with tempfile.TemporaryDirectory(prefix="gpubox-wheel-") as tmp:
        tree = os.path.join(tmp, "src")
        shutil.copytree(src, tree, ignore=IGNORE, symlinks=False)
        out = os.path.join(tmp, "out")
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
                "-w", out, tree]
        if not module.params["build_isolation"]:
            argv.insert(4, "--no-build-isolation")
        # Fixed zip timestamps (1980-01-01) where the backend honours SOURCE_DATE_EPOCH.
        env = dict(os.environ, SOURCE_DATE_EPOCH="315532800")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp)
        if proc.returncode != 0:
            module.fail_json(msg="building the gpubox wheel failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1],
                             cmd=argv, stderr=proc.stderr, stdout=proc.stdout, rc=proc.returncode)
        built = [f for f in os.listdir(out) if f.endswith(".whl")]
        if len(built) != 1:
            module.fail_json(msg=f"expected one wheel, pip wrote {built}")
        name = built[0]
        new = os.path.join(out, name)
        digest = content_digest(new)
        target = os.path.join(dest, name)
        changed = not (os.path.exists(target) and content_digest(target) == digest)
        if changed:
            # A control-node build artifact: written in check mode too, so the copy task can
            # say what it would change on the managed hosts.
            os.makedirs(dest, exist_ok=True)
            staging = os.path.join(dest, f".{name}.tmp")
            shutil.copyfile(new, staging)
            os.replace(staging, target)
    module.exit_json(changed=changed, path=target, filename=name, content_sha256=digest)


if __name__ == "__main__":
    main()
