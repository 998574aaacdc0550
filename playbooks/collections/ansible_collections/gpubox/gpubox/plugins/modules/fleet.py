#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpubox contributors
# Apache License 2.0 (see LICENSE in the collection)
"""Ansible module: the fleet summary on the control node (healthy / degraded / failed boxes).

Runs on the control node over the per-box results the gpubox_box module returned (the same
fields as `gpubox --json`), so it needs only the standard library: no gpubox install there.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
  - A box whose host lacks the play's gpubox build (the box module said RV(needs_install), or its
    venv's interpreter is missing) is V(failed) with "not checked", and its host is listed in
    RV(needs_install) (run C(playbooks/install.yml) for it; doctor and check mode install nothing).
  - Writes O(dest) (JSON) when given, and each box's result as O(results_dir)C(/<box>.json).
    C(changed) is always false, since these are reports on the control node, not a change to any box.
  - With O(fail_on), fails (once, after every box has its result) when a box ends in one of those
    states, naming them.
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
  results_dir:
    description: Where to write each box's result as C(<box>.json) (control node).
    type: path
  bench_dir:
    description: Where each benchmark result file goes on the control node, as
      C(<bench_dir>/<box>/<its file name on the box>) (the box module returns its text).
    type: path
  errors:
    description: Box -> the input gate's message (from M(gpubox.gpubox.preflight)); such a box did not run.
    type: dict
    default: {}
  recovered:
    description: Box -> its recover result when a benchmark followed it; O(results) then holds the
      benchmark's result, added as C(benchmark) (as C(gpubox recover --json) has it).
    type: dict
    default: {}
  hosts:
    description: Box -> the machine its module ran on (named for unreachable hosts and missing installs).
    type: dict
    default: {}
  fail_on:
    description: Fail when a box ends in one of these states.
    type: list
    elements: str
    default: []
    choices: [healthy, degraded, failed]
attributes:
  check_mode:
    support: full
    description: The same in check mode (the reports are written on the control node).
  diff_mode:
    support: none
    description: Nothing to diff; it writes reports on the control node only.
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
needs_install:
  description: The hosts that lack the play's gpubox build (run C(playbooks/install.yml) there).
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


def missing_interpreter(result):
    """The module never started: the venv's python is not there (gpubox never installed)."""
    return bool(result.get("rc") == 127 and "box" not in result and result.get("failed"))


def needs_install(result):
    return isinstance(result, dict) and bool(result.get("needs_install") or missing_interpreter(result))


def classify(result, host=""):
    """(status, reason) of one box's result."""
    if not isinstance(result, dict) or not result:
        return "failed", "no result (the box's tasks did not run)"
    if result.get("unreachable"):
        return "failed", f"cannot reach {host or 'its host'}: {result.get('msg', '')}".strip()
    if needs_install(result):
        found = result.get("installed") or "none"
        return "failed", (f"not checked: {host or 'its host'} lacks gpubox {result.get('build') or 'of this checkout'} "
                          f"(installed: {found}): run playbooks/install.yml -l {host or 'HOST'}")
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


def merge_bench(res, bench):
    """recover's result with the benchmark that followed (as `gpubox recover --json` has it)."""
    if not isinstance(bench, dict) or not bench or bench.get("skipped") and "verdict" not in bench:
        return res
    res = dict(res)
    if "verdict" in bench:
        res["ok"] = bool(res.get("ok")) and bool(bench.get("ok"))
        res["exit_code"] = max(res.get("exit_code") or 0, bench.get("exit_code") or 0)
        res["benchmark"] = {"verdict": bench["verdict"], "result": bench.get("result_path"), "report": None}
    else:  # the benchmark could not run (its host, its install): the box is not verified
        res.update(ok=False, msg="benchmark: " + str(bench.get("msg") or "did not run"),
                   benchmark={"verdict": None})
    return res


def copy_result_file(bench_dir, box, bench):
    """The benchmark's result file, as written on the box, into BENCH_DIR/BOX/ on the control node."""
    if not bench_dir or not isinstance(bench, dict) or not bench.get("result_text") or not bench.get("result_path"):
        return
    name = os.path.basename(str(bench["result_path"]))
    if not name.endswith(".json") or name.startswith("."):
        return
    folder = os.path.join(bench_dir, box)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, ".%s.tmp.%d" % (name, os.getpid()))
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(bench["result_text"])
    os.replace(tmp, os.path.join(folder, name))


def _write(path, doc):
    """Atomic JSON write on the control node."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def table(rows, title):
    wb = max([len("box")] + [len(name) for name in dict(rows)])
    lines = [title, f"{'box'.ljust(wb)}  {'status':8}  changed  reason"]
    for b, r in rows:
        lines.append(f"{b.ljust(wb)}  {r['status']:8}  {'yes' if r['changed'] else 'no ':7}  {r['reason'][:160]}")
    return lines


def main():
    module = AnsibleModule(
        argument_spec=dict(boxes=dict(type="list", elements="str", required=True),
                           results=dict(type="dict", default={}),
                           action=dict(type="str", default="recover"),
                           dest=dict(type="path"),
                           results_dir=dict(type="path"),
                           bench_dir=dict(type="path"),
                           errors=dict(type="dict", default={}),
                           recovered=dict(type="dict", default={}),
                           hosts=dict(type="dict", default={}),
                           fail_on=dict(type="list", elements="str", default=[],
                                        choices=["healthy", "degraded", "failed"])),
        supports_check_mode=True,
    )
    p = module.params
    boxes, results, install = {}, {}, set()
    for name in sorted(set(p["boxes"])):
        host = str((p["hosts"] or {}).get(name) or "")
        if name in (p["errors"] or {}):
            res = {"box": name, "ok": False, "failed": True, "msg": p["errors"][name], "exit_code": 2}
        else:
            res = (p["results"] or {}).get(name) or {}
            first = (p["recovered"] or {}).get(name)
            bench = res if first or p["action"] == "bench" else {}
            copy_result_file(p["bench_dir"], name, bench)
            if isinstance(bench, dict) and bench.get("result_text"):
                res = {k: v for k, v in res.items() if k != "result_text"}
            if first:
                res = merge_bench(first, res)
        res = {k: v for k, v in res.items() if k != "invocation"}
        if needs_install(res):
            install.add(host or name)
        status, reason = classify(res, host)
        results[name] = res
        boxes[name] = {"status": status, "reason": " ".join(reason.split()),
                       "changed": bool(res.get("changed")), "exit_code": res.get("exit_code")}
    groups = {k: [b for b, r in boxes.items() if r["status"] == k] for k in ("healthy", "degraded", "failed")}
    lines = table(list(boxes.items()), f"gpubox {p['action']}: {len(groups['healthy'])} healthy, "
                                       f"{len(groups['degraded'])} degraded, {len(groups['failed'])} failed")
    if install:
        lines.append("needs playbooks/install.yml (this build is not there): " + ", ".join(sorted(install)))
    doc = {"action": p["action"], "check_mode": module.check_mode,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "boxes": boxes,
           "needs_install": sorted(install), **groups}
    # Reports on the control node, written in check mode too.
    if p["results_dir"]:
        os.makedirs(p["results_dir"], exist_ok=True)
        for name, res in results.items():
            _write(os.path.join(p["results_dir"], name + ".json"), res)
    if p["dest"]:
        os.makedirs(os.path.dirname(p["dest"]) or ".", exist_ok=True)
        _write(p["dest"], doc)
    out = dict(changed=False, lines=lines, summary_path=p["dest"], boxes=boxes, by_status=groups,
               action=p["action"], needs_install=sorted(install))
    picked = [b for b, r in boxes.items() if r["status"] in p["fail_on"]]
    if picked:
        why = "; ".join(f"{b}: {boxes[b]['reason']}" for b in picked)
        module.fail_json(msg=f"{len(picked)} box(es) {'/'.join(p['fail_on'])}: {', '.join(picked)} -- {why}", **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
