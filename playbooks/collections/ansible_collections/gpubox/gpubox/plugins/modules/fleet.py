#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the fleet summary on the control node (healthy / degraded / failed boxes).

Runs on the control node over the per-box results the gpubox_box module returned (the same
fields as `gpubox --json`), so it needs only the standard library: no gpubox install there.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet
short_description: Classify each box's gpubox result as healthy, degraded or failed and write a fleet summary
description:
  - V(failed) - the run could not complete (unreachable host, bad input, gpubox error), a step
    failed or was blocked, or the benchmark verdict is failed.
  - V(degraded) - nothing failed, but problems remain (a step in drift, e.g. found by doctor or
    planned in check mode; in check mode also steps that fail behind a planned repair) or the
    benchmark verdict is degraded.
  - V(healthy) - every step ok or fixed, and the benchmark (when run) healthy.
  - Writes O(dest) (JSON) when given. C(changed) is always false, since the summary is a report on the
    control node, not a change to any box.
version_added: "0.1.0"
author: gpubox contributors (@gpubox)
options:
  boxes:
    description: The boxes the play ran on (a box without a result counts as failed).
    type: list
    elements: str
    required: true
  results:
    description: Box name -> the result its gpubox_box task returned.
    type: dict
    default: {}
  action:
    description: The playbook's action, for the summary's title.
    type: str
    default: recover
  dest:
    description: Where to write the summary JSON (control node).
    type: path
"""

EXAMPLES = r"""
- name: Summarise the fleet
  gpubox.gpubox.fleet:
    boxes: "{{ ansible_play_hosts_all }}"
    results: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'gpubox_box_result'))) }}"
    dest: "{{ gpubox_results_dir }}/summary.json"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
by_status:
  description: healthy / degraded / failed -> the boxes in that state. (Not top-level keys, since
    Ansible reads a result's C(failed) key as the task's own status.)
  type: dict
  returned: always
boxes:
  description: Box -> its status, reason, changed and exit_code.
  type: dict
  returned: always
lines:
  description: The summary as table lines for people.
  type: list
  elements: str
  returned: always
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule


def _bad_steps(steps, status):
    out = []
    for s in steps:
        blocked = s.get("status") == "skipped" and (s.get("evidence") or {}).get("blocked_by")
        if s.get("status") == status or (status == "failed" and blocked):
            out.append(f"{s.get('name')}: {s.get('detail', '')}".strip())
    return out


def classify(result):
    """(status, reason) of one box's result."""
    if not isinstance(result, dict) or not result:
        return "failed", "no result (the box's tasks did not run)"
    if result.get("unreachable"):
        return "failed", f"unreachable: {result.get('msg', '')}".strip()
    steps = result.get("steps")
    verdict = (result.get("benchmark") or {}).get("verdict") or result.get("verdict") or {}
    if steps is None and not verdict:
        if result.get("skipped"):
            return "healthy", result.get("msg") or "skipped"
        return "failed", str(result.get("msg") or "no steps ran")
    failed = _bad_steps(steps or [], "failed")
    drift = _bad_steps(steps or [], "drift")
    if failed and drift and result.get("mode") == "plan":
        # Check mode: what fails now may be the consequence of what the plan repairs.
        return "degraded", "would repair " + "; ".join(drift[:3]) + " (then re-check: " + \
            ", ".join(f.split(":")[0] for f in failed) + ")"
    if failed:
        return "failed", "; ".join(failed[:3])
    if verdict.get("status") == "failed":
        return "failed", "benchmark failed: " + "; ".join(r.get("message", "") for r in verdict.get("reasons", [])[:2])
    if drift:
        return "degraded", "; ".join(drift[:3])
    if verdict.get("status") == "degraded":
        return "degraded", "benchmark degraded: " + "; ".join(r.get("message", "") for r in verdict.get("reasons", [])[:2])
    if result.get("failed"):
        return "failed", str(result.get("msg") or "failed")
    return "healthy", "all checks ok" + (f", benchmark {verdict['status']}" if verdict.get("status") else "")


def table(rows, title):
    wb = max([len("box")] + [len(b) for b, _ in rows])
    lines = [title, f"{'box'.ljust(wb)}  {'status':8}  changed  reason"]
    for b, r in rows:
        lines.append(f"{b.ljust(wb)}  {r['status']:8}  {'yes' if r['changed'] else 'no ':7}  {r['reason'][:160]}")
    return lines


def main():
    module = AnsibleModule(
        argument_spec=dict(boxes=dict(type="list", elements="str", required=True),
                           results=dict(type="dict", default={}),
                           action=dict(type="str", default="recover"),
                           dest=dict(type="path")),
        supports_check_mode=True,
    )
    p = module.params
    boxes = {}
    for name in sorted(set(p["boxes"])):
        res = (p["results"] or {}).get(name)
        status, reason = classify(res)
        boxes[name] = {"status": status, "reason": " ".join(reason.split()),
                       "changed": bool((res or {}).get("changed")), "exit_code": (res or {}).get("exit_code")}
    groups = {k: [b for b, r in boxes.items() if r["status"] == k] for k in ("healthy", "degraded", "failed")}
    lines = table(list(boxes.items()), f"gpubox {p['action']}: {len(groups['healthy'])} healthy, "
                                       f"{len(groups['degraded'])} degraded, {len(groups['failed'])} failed")
    doc = {"action": p["action"], "check_mode": module.check_mode,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "boxes": boxes, **groups}
    if p["dest"]:
        # Written in check mode too: it is the report of the run, on the control node.
        os.makedirs(os.path.dirname(p["dest"]) or ".", exist_ok=True)
        tmp = p["dest"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, p["dest"])
    module.exit_json(changed=False, lines=lines, summary_path=p["dest"], boxes=boxes, by_status=groups,
                     action=p["action"])


if __name__ == "__main__":
    main()
