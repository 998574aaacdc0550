#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpubox contributors
# Apache License 2.0 (see LICENSE in the collection)
"""Ansible module: what a playbook run checks once, on the control node, before any box is touched."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: preflight
short_description: Check the inventory and every box's variables with gpubox's gate, and name this checkout's build
description:
  - Runs once per play on the control node, with the gpubox library of the checkout O(src).
  - Reads each inventory file of O(inventory_sources) with the gate the gpubox CLI applies to
    C(-i) (C(gpubox.inventory.check_source)), on the source text, before Ansible's YAML 1.1 reading
    turns a typo into another value (a C(gpubox_vmid) written 0200 is octal 128 once parsed, so the box
    modules cannot see it). A problem there fails the task, and so the whole play, before any
    change; the message is the CLI's.
  - Checks every box's and its Proxmox host's variables as Ansible resolved them (extra-vars
    included) with the CLI's per-box gate (C(gpubox.invschema.check_box)); a bad box is returned in
    RV(errors) with the CLI's message, and the other boxes carry on.
  - Names the build this checkout makes (C(<version>+<digest>), the same as M(gpubox.gpubox.wheel))
    so each box's module call can tell whether its host has it, without building anything.
version_added: "0.1.0"
author: gpubox contributors (@gpubox)
options:
  src:
    description: The gpubox checkout (the directory holding pyproject.toml); its library is imported.
    type: path
    required: true
  inventory_sources:
    description: The play's inventory sources (C(ansible_inventory_sources)); host lists such as
      C(a,b,) and sources that are not YAML files or directories are left to Ansible.
    type: list
    elements: str
    default: []
  boxes:
    description: The play's boxes (inventory names).
    type: list
    elements: str
    default: []
  variables:
    description: Inventory host -> its C(gpubox_*) variables as Ansible resolved them, for the boxes
      and their Proxmox hosts (a box's host is its C(gpubox_proxmox_host)).
    type: dict
    default: {}
  cache:
    description: The wheel cache on the control node (see M(gpubox.gpubox.wheel)).
    type: path
    default: ~/.cache/gpubox/wheels
attributes:
  check_mode:
    support: full
    description: Reads only; the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff; it only reads.
"""

EXAMPLES = r"""
- name: Check the inventory and the boxes' variables
  gpubox.gpubox.preflight:
    src: "{{ playbook_dir }}/.."
    inventory_sources: "{{ ansible_inventory_sources }}"
    boxes: "{{ ansible_play_hosts }}"
    variables:
      ct200: {gpubox_vmid: 200, gpubox_proxmox_host: pve1}
      pve1: {}
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
build:
  description: The build this checkout makes.
  type: str
  returned: always
  sample: 0.1.0+3f2a9c01be77
wheel:
  description: Its wheel in the cache, or the empty string when it is not built yet.
  type: str
  returned: always
errors:
  description: Box -> the gate's one-line message, for each box whose variables are bad.
  type: dict
  returned: always
vmids:
  description: Box -> its vmid, for each box that passed.
  type: dict
  returned: always
"""

import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpubox.gpubox.plugins.module_utils.build import build_id, cached_wheel


def _yaml_source(source):
    """A source the gate reads: an existing YAML file or a directory; None for what Ansible alone
    reads (`a,b,` host lists, scripts, INI files are still read: gpubox's gate names them)."""
    if "," in source and not os.path.exists(source):
        return None
    return source


def main():
    module = AnsibleModule(
        argument_spec=dict(src=dict(type="path", required=True),
                           inventory_sources=dict(type="list", elements="str", default=[]),
                           boxes=dict(type="list", elements="str", default=[]),
                           variables=dict(type="dict", default={}),
                           cache=dict(type="path", default="~/.cache/gpubox/wheels")),
        supports_check_mode=True,
    )
    p = module.params
    src = p["src"]
    if not os.path.isfile(os.path.join(src, "pyproject.toml")):
        module.fail_json(msg="%s has no pyproject.toml (point gpubox_source at the gpubox checkout)" % src)
    sys.path.insert(0, src)  # the checkout's own gate: the library the hosts will run
    try:
        from gpubox.errors import GpuboxError
        from gpubox.inventory import check_source
        from gpubox.invschema import check_box
    except ImportError as exc:
        module.fail_json(msg="cannot import gpubox from %s with %s: %s" % (src, sys.executable, exc))
    for source in p["inventory_sources"] or []:
        path = _yaml_source(source)
        if path is None:
            continue
        try:
            check_source(path)
        except GpuboxError as exc:
            module.fail_json(msg=str(exc), exit_code=exc.exit_code, inventory=source)
    errors, vmids = {}, {}
    variables = p["variables"] or {}
    for name in sorted(set(p["boxes"] or [])):
        mine = variables.get(name) or {}
        host = mine.get("gpubox_proxmox_host")
        host = host if isinstance(host, str) and host else None
        try:
            vmids[name] = check_box(name, mine, host, (variables.get(host) or {}) if host else {})
        except GpuboxError as exc:
            errors[name] = str(exc)
    build = build_id(src)
    module.exit_json(changed=False, build=build, wheel=cached_wheel(p["cache"], build) or "",
                     errors=errors, vmids=vmids)


if __name__ == "__main__":
    main()
