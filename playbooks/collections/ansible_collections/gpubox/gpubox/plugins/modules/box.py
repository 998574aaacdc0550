#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpubox contributors
# Apache License 2.0 (see LICENSE in the collection)
"""Ansible module: run one gpubox action (doctor, recover, tune, stage, bench) for one box.

A thin adapter over the gpubox library (docs/architecture.md "One library, every front end"): it builds the
same Box/HostEntry objects the CLI builds from the inventory, then calls the same functions the
CLI calls (provision.recover.doctor/recover, hwtune.steps, provision.stage_step.steps,
bench.runner.run_box). No check, plan or repair logic lives here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: box
short_description: Check, repair, tune, stage or benchmark one gpubox box with the gpubox library
description:
  - Runs on the box's Proxmox host (tasks for C(gpu_containers) hosts delegated to
    C(gpubox_proxmox_host)), or inside the container for O(action=bench).
  - The Proxmox host is reached locally (its C(gpubox_root) honoured); the container with
    C(pct exec), or locally when its connection says so (the simulated box).
  - Results carry the same fields as C(gpubox ... --json).
  - In check mode, recover/tune/stage plan only (gpubox's C(--dry-run)) and change nothing.
  - Every action first checks the box's and host's variables with gpubox's inventory schema
    (C(gpubox.invschema.check_box), the gate the CLI applies); a bad value fails the task naming the
    variable, before anything is read. O(action=validate) does only that (the roles run it on the
    control node before installing anything).
version_added: "0.1.0"
author: gpubox contributors (@gpubox)
options:
  action:
    description: What to run.
    type: str
    required: true
    choices: [doctor, recover, tune, stage, bench, validate, autostart, autostart-remove]
  box:
    description: Inventory name of the box (the container).
    type: str
    required: true
  box_vars:
    description: The box's C(gpubox_*) variables (from hostvars).
    type: dict
    required: true
  host:
    description: Inventory name of the box's Proxmox host.
    type: str
    required: true
  host_vars:
    description: The Proxmox host's C(gpubox_*) variables (from hostvars).
    type: dict
    default: {}
  container_connection:
    description:
      - How to reach the container. V(auto) uses the box's C(gpubox_connection) when it is
        V(local) or V(pct), V(local) when the box's C(ansible_connection) is local, else V(pct).
    type: str
    default: auto
    choices: [auto, local, pct]
  container_ansible_connection:
    description: The box's C(ansible_connection), for V(auto).
    type: str
    default: ssh
  where:
    description:
      - V(host) when the module runs on the Proxmox host, V(container) when it runs inside the
        container (for bench, since the server is launched where it runs).
    type: str
    default: host
    choices: [host, container]
  skip:
    description: Steps or groups to skip (like C(--skip)).
    type: list
    elements: str
    default: []
  only:
    description: Only these steps or groups (like C(--only)).
    type: list
    elements: str
    default: []
  restart:
    description: Container restart policy when a config change needs it.
    type: str
    default: auto
    choices: [auto, never, always]
  persist:
    description: Also make host repairs survive the next reboot.
    type: bool
    default: true
  bench_profile:
    description: Benchmark profile (default the box's, else health).
    type: str
  tp:
    description: Benchmark TP sizes (default from the profile).
    type: list
    elements: int
  methods:
    description: Benchmark methods (default from the profile).
    type: list
    elements: str
  out_dir:
    description: Where benchmark results go on the machine the module runs on.
    type: path
  state_dir:
    description: gpubox state directory (backups, last run) on that machine; default C(~/.local/state/gpubox).
    type: path
  fail_on_problems:
    description: Fail the task when problems remain (like the CLI's exit status 1).
    type: bool
    default: true
  build:
    description:
      - The gpubox build the play expects (C(<version>+<digest>), from M(gpubox.gpubox.preflight)).
        When the venv the module runs in holds another build (or none), the module runs nothing and
        returns RV(needs_install), so the play installs this build first (or, for doctor and check
        mode, says that the host needs C(playbooks/install.yml)).
      - Omitted, whatever gpubox the interpreter imports runs.
    type: str
attributes:
  check_mode:
    support: full
    description: recover, tune, stage and autostart plan only (gpubox's C(--dry-run)); C(changed) then
      means "would change". doctor and validate read only; bench is skipped.
  diff_mode:
    support: full
    description: Each step's unified diff and the exact commands it runs (or would run).
"""

EXAMPLES = r"""
- name: Recover the box
  gpubox.gpubox.box:
    action: recover
    box: "{{ inventory_hostname }}"
    box_vars: "{{ hostvars[inventory_hostname] | dict2items | selectattr('key', 'match', '^gpubox_') | items2dict }}"
    host: "{{ gpubox_proxmox_host }}"
    host_vars: "{{ hostvars[gpubox_proxmox_host] | dict2items | selectattr('key', 'match', '^gpubox_') | items2dict }}"
  delegate_to: "{{ gpubox_proxmox_host }}"
"""

RETURN = r"""
box:
  description: The box.
  type: str
  returned: always
mode:
  description: check, plan or apply (as gpubox --json).
  type: str
  returned: when steps ran
ok:
  description: No problem remains (as gpubox --json).
  type: bool
  returned: always
steps:
  description: One record per step (name, host, status, changed, detail, diff, commands, evidence, cause, repair, seconds).
  type: list
  returned: when steps ran
exit_code:
  description: The CLI's exit status for the same run (0 ok, 1 problems, 2 could not run). Not
    C(rc), which Ansible reads as a failed command when non-zero.
  type: int
  returned: always
gpubox_version:
  description: Version of the gpubox library that ran.
  type: str
  returned: always
result_path:
  description: bench - the result JSON on the machine that ran it (C(path) in C(gpubox bench --json)).
  type: str
  returned: for bench
result_text:
  description: bench - that file's text, which M(gpubox.gpubox.fleet) copies to the control node.
  type: str
  returned: for bench
gpubox_location:
  description: Where that library was imported from (the venv on the managed host).
  type: str
  returned: always
needs_install:
  description: The venv holds another build than O(build) (or none); nothing ran.
  type: bool
  returned: when O(build) is given and differs
installed:
  description: The build the venv holds (empty when none).
  type: str
  returned: when O(build) is given
"""

import contextlib
import os
import shlex
import sys
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpubox.gpubox.plugins.module_utils.build import MARKER  # the venv's build

# Variables that say how gpubox reaches a host from the control node; on the managed host the
# module is already there, so they are dropped (the key file path, for one, is the control node's).
_CONNECTION_VARS = ("gpubox_known_hosts", "gpubox_ssh_password_env")


def installed_build():
    """The build the running venv holds ('' when none is recorded)."""
    try:
        with open(os.path.join(sys.prefix, MARKER)) as f:
            return f.read().strip()
    except OSError:
        return ""


def _entry(name, variables, connection):
    from gpubox.inventory import HostEntry

    v = {k: val for k, val in (variables or {}).items() if k not in _CONNECTION_VARS}
    v["gpubox_connection"] = connection
    # Ansible's become already made the module run as root: no `sudo -n` inside.
    v.pop("ansible_become", None)
    return HostEntry(name, v, [])


def container_connection(p):
    """How the module reaches the container from where it runs."""
    if p["where"] == "container":
        return "local"
    if p["container_connection"] != "auto":
        return p["container_connection"]
    own = str((p["box_vars"] or {}).get("gpubox_connection") or "")
    if own in ("local", "pct"):
        return own
    if p["container_ansible_connection"] == "local":
        return "local"          # the simulated box, or a container that is this machine
    return "pct"                # from its Proxmox host, `pct exec` needs no credentials


def check_input(p):
    """The CLI's gate (gpubox.invschema.check_box) on the variables as Ansible resolved them,
    extra-vars included: the same bad value gives the same one-line error everywhere."""
    from gpubox.invschema import check_box

    return check_box(p["box"], p["box_vars"] or {}, p["host"], p["host_vars"] or {})


def make_context(p):
    from gpubox.context import Context
    from gpubox.inventory import Box

    check_input(p)
    host = _entry(p["host"], p["host_vars"], "local")
    ct = _entry(p["box"], p["box_vars"], container_connection(p))
    ct.vars["gpubox_proxmox_host"] = p["host"]
    box = Box(container=ct, host=host)
    options = {"yes": True, "restart": p["restart"], "persist": p["persist"], "as_json": True,
               "dry_run": False, "bench_profile": p["bench_profile"]}
    return Context(box=box, inventory=None, options=options, console=None)


def _run(p, ctx, check_mode):
    """Call the library the way the matching CLI command does; return (result dict, rc)."""
    from gpubox.pipeline import run_steps

    action, mode = p["action"], ("plan" if check_mode else "apply")
    ctx.options["dry_run"] = check_mode
    if action == "doctor":
        from gpubox.provision.recover import doctor
        rep = doctor(ctx, tuple(p["skip"]), tuple(p["only"]))
        return rep.to_dict(), rep.exit_code
    if action == "recover":
        from gpubox.provision.recover import recover
        out = recover(ctx, dry_run=check_mode, skip=tuple(p["skip"]), only=tuple(p["only"]),
                      bench=False, profile=p["bench_profile"], out_dir=p["out_dir"])
        return out.to_dict(), out.exit_code
    if action == "tune":
        from gpubox import hwtune
        rep = run_steps(ctx, hwtune.steps(ctx), mode)
        return rep.to_dict(), rep.exit_code
    if action == "stage":
        from gpubox.provision.stage_step import steps, summaries
        rep = run_steps(ctx, steps(ctx), mode)
        staged = summaries(rep)     # the copies' summaries, from the steps' evidence
        if staged:
            rep.extra["staged"] = staged
        return rep.to_dict(), rep.exit_code
    if action in ("autostart", "autostart-remove"):  # as `gpubox autostart install|remove BOX`
        from gpubox.provision.autostart import spec_from
        from gpubox.provision.autostart_step import InstallStep, RemoveStep
        step = (InstallStep if action == "autostart" else RemoveStep)(spec_from(ctx.box))
        rep = run_steps(ctx, [step], mode)
        return rep.to_dict(), rep.exit_code
    # bench: measuring changes nothing on the box, but it launches servers: not in check mode.
    if check_mode:
        return {"box": p["box"], "ok": True, "skipped": True,
                "msg": "benchmark not run in check mode (it launches the inference server)"}, 0
    from gpubox.bench.runner import run_box
    from gpubox.bench.verdict import exit_code
    doc = run_box(ctx, profile=p["bench_profile"], out_dir=p["out_dir"], tps=p["tp"], methods=p["methods"])
    doc = dict(doc)
    # `path` in a module result makes Ansible add that file's owner/mode/size to the result.
    doc["result_path"] = doc.pop("path", None)
    if doc["result_path"]:
        # The file as written, so the control node keeps an exact copy with no fetch task per box.
        with open(doc["result_path"], encoding="utf-8") as f:
            doc["result_text"] = f.read()
    doc["ok"] = exit_code(doc["verdict"]) == 0
    return doc, exit_code(doc["verdict"])


def _diffs(result, check_mode):
    """Ansible --diff output: one prepared text per step that would change (check) or changed."""
    out = []
    for s in result.get("steps") or []:
        if not (s.get("changed") or (check_mode and s.get("status") == "drift")):
            continue
        text = s.get("diff") or ""
        cmds = "".join(f"# run: {shlex.join(c)}\n" for c in s.get("commands") or [])
        if not (text or cmds):
            continue
        head = f"# {s['name']} on {s['host']}: {s.get('detail', '')}\n"
        out.append({"prepared": head + text + ("" if not text or text.endswith("\n") else "\n") + cmds})
    return out


def would_change(result):
    """Check mode: Ansible's `changed` means "would change" (a step in drift with a plan)."""
    return any(s.get("status") == "drift" and (s.get("diff") or s.get("commands"))
               for s in result.get("steps") or [])


def problems(result):
    """One line per step that did not end well, for the failure message."""
    lines = []
    for s in result.get("steps") or []:
        blocked = s.get("status") == "skipped" and (s.get("evidence") or {}).get("blocked_by")
        if s.get("status") in ("drift", "failed") or blocked:
            fix = f" (fix: {s['repair']})" if s.get("repair") else ""
            lines.append(f"{s['name']} {s['status']}: {s.get('detail', '')}{fix}")
    verdict = (result.get("benchmark") or {}).get("verdict") or result.get("verdict") or {}
    if verdict.get("status") not in (None, "healthy"):
        reasons = "; ".join(r.get("message", "") for r in verdict.get("reasons", [])[:3])
        lines.append(f"benchmark {verdict['status']}: {reasons}")
    return lines


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True,
                        choices=["doctor", "recover", "tune", "stage", "bench", "validate",
                                 "autostart", "autostart-remove"]),
            box=dict(type="str", required=True),
            box_vars=dict(type="dict", required=True),
            host=dict(type="str", required=True),
            host_vars=dict(type="dict", default={}),
            container_connection=dict(type="str", default="auto", choices=["auto", "local", "pct"]),
            container_ansible_connection=dict(type="str", default="ssh"),
            where=dict(type="str", default="host", choices=["host", "container"]),
            skip=dict(type="list", elements="str", default=[]),
            only=dict(type="list", elements="str", default=[]),
            restart=dict(type="str", default="auto", choices=["auto", "never", "always"]),
            persist=dict(type="bool", default=True),
            bench_profile=dict(type="str"),
            tp=dict(type="list", elements="int"),
            methods=dict(type="list", elements="str"),
            out_dir=dict(type="path"),
            state_dir=dict(type="path"),
            fail_on_problems=dict(type="bool", default=True),
            build=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["build"]:
        installed = installed_build()
        if installed != p["build"]:
            # Nothing of this library runs: the play installs this build first (apply), or says
            # which host needs playbooks/install.yml (doctor, check mode).
            found = ("build " + installed) if installed else "no gpubox build"
            module.exit_json(changed=False, ok=False, box=p["box"], needs_install=True, installed=installed,
                             build=p["build"], exit_code=2,
                             msg="gpubox %s is not installed for %s (found %s)" % (p["build"], sys.executable, found))
    if p["state_dir"]:
        os.environ["GPUBOX_STATE_DIR"] = p["state_dir"]
    try:
        import gpubox
        from gpubox.errors import GpuboxError
    except ImportError as exc:
        if p["action"] == "validate":  # not on this machine: the action's own call checks, where it runs
            module.exit_json(changed=False, skipped=True, box=p["box"],
                             msg=f"gpubox is not importable by {sys.executable}; checked where it runs")
        module.fail_json(msg=f"gpubox is not installed for {sys.executable}: {exc} "
                             "(run the gpubox_install role, or point ansible_python_interpreter at the gpubox venv)",
                         exit_code=2)
    where = {"gpubox_version": getattr(gpubox, "__version__", "?"),
             "gpubox_location": os.path.dirname(os.path.abspath(gpubox.__file__))}
    if p["action"] == "validate":
        try:
            vmid = check_input(p)
        except GpuboxError as exc:
            module.fail_json(msg=str(exc), box=p["box"], ok=False, exit_code=exc.exit_code, **where)
        module.exit_json(changed=False, box=p["box"], ok=True, vmid=vmid, exit_code=0, **where)
    ctx = None
    try:
        # Anything the library prints must not corrupt the module's JSON on stdout.
        with contextlib.redirect_stdout(sys.stderr):
            ctx = make_context(p)
            result, rc = _run(p, ctx, module.check_mode)
    except GpuboxError as exc:
        module.fail_json(msg=str(exc), box=p["box"], ok=False, exit_code=exc.exit_code, **where)
    except Exception as exc:  # a library bug: one line, the traceback for -vvv
        module.fail_json(msg=f"internal error: {type(exc).__name__}: {exc}", box=p["box"], ok=False, exit_code=2,
                         exception=traceback.format_exc(), **where)
    finally:
        if ctx is not None:
            ctx.close()
    result = dict(result)
    result.update(where)
    result["exit_code"] = rc
    result["changed"] = would_change(result) if module.check_mode else bool(result.get("changed"))
    if module._diff:
        result["diff"] = _diffs(result, module.check_mode)
    bad = problems(result)
    failing = bad
    if module.check_mode:
        # A plan with drift is what check mode is for; steps failing behind it (cuda while the
        # uvm rule is stale) cannot be judged until the plan is applied. Fail only when nothing
        # is planned that could help.
        failing = [] if any(" drift: " in b for b in bad) else bad
    if p["fail_on_problems"] and rc != 0 and failing:
        result.pop("msg", None)
        module.fail_json(msg=f"{p['box']}: {len(failing)} problem(s): " + " | ".join(failing), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
