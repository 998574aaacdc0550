"""The alert hook: `gpubox_alert_command` runs on the box when a health check is not healthy.

The command is an argv list from the inventory (never a shell string); it gets the verdict JSON
on stdin and a time limit. Its failure is reported in the run's output, never fatal: a broken
pager must not hide the verdict it was meant to carry.
"""

from __future__ import annotations

import json
from typing import Any

from gpubox.errors import GpuboxError

DEFAULT_TIMEOUT = 30.0


def command_of(box) -> list[str] | None:
    """The box's alert argv, validated (None when not configured)."""
    cmd = box.var("gpubox_alert_command")
    if cmd in (None, "", []):
        return None
    if isinstance(cmd, str):
        raise GpuboxError(
            f"box {box.name}: gpubox_alert_command is a string ({cmd!r})",
            'write it as an argv list, e.g. ["/usr/local/bin/notify-oncall", "--team", "inference"]',
        )
    if not isinstance(cmd, list) or not all(isinstance(a, (str, int, float)) for a in cmd):
        raise GpuboxError(
            f"box {box.name}: gpubox_alert_command must be a list of strings", "see inventory/example.yml"
        )
    return [str(a) for a in cmd]


def timeout_of(box) -> float:
    t = box.var("gpubox_alert_timeout", DEFAULT_TIMEOUT)
    try:
        t = float(t)
    except (TypeError, ValueError):
        t = -1
    if t <= 0:
        raise GpuboxError(
            f"box {box.name}: gpubox_alert_timeout {box.var('gpubox_alert_timeout')!r} is not a positive number",
            "give seconds, e.g. 30",
        )
    return t


def payload(doc: dict[str, Any]) -> dict[str, Any]:
    """What the hook reads on stdin: the verdict plus which run it is about."""
    v = doc.get("verdict") or {}
    return {
        "schema": "gpubox.alert/1",
        "box": doc.get("box"),
        "run_id": doc.get("run_id"),
        "profile": doc.get("profile"),
        "started_at": doc.get("started_at"),
        "finished_at": doc.get("finished_at"),
        "simulated": bool(doc.get("simulated")),
        "status": v.get("status"),
        "reasons": v.get("reasons") or [],
    }


def fire(
    host, argv: list[str] | None, doc: dict[str, Any], timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """Run the hook on HOST when DOC's verdict is degraded or failed; report what happened."""
    status = (doc.get("verdict") or {}).get("status")
    if status not in ("degraded", "failed"):
        return {"fired": False, "reason": f"verdict is {status}"}
    if not argv:
        return {"fired": False, "reason": "no gpubox_alert_command configured"}
    data = json.dumps(payload(doc), indent=None) + "\n"
    run_argv, limit = list(argv), timeout
    if not getattr(host.transport, "is_local", False):
        # Over SSH/pct closing our channel does not kill the hook: coreutils timeout(1) runs it in
        # its own process group there and signals that whole group (then SIGKILL after 5 s).
        run_argv, limit = ["timeout", "--kill-after=5", f"{timeout:g}", *argv], timeout + 15
    try:
        r = host.run(run_argv, input=data, timeout=limit)
    except GpuboxError as exc:  # timed out, or could not be started on the host
        return {"fired": True, "ok": False, "argv": argv, "rc": None, "error": str(exc)}
    if r.rc == 124 and run_argv is not argv and run_argv[0] == "timeout":
        return {
            "fired": True,
            "ok": False,
            "argv": argv,
            "rc": None,
            "error": f"timed out after {timeout:g} s",
        }
    out = {"fired": True, "ok": r.rc == 0, "argv": argv, "rc": r.rc}
    if r.rc != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        out["error"] = f"exited {r.rc}: {tail[0]}".rstrip(": ")
    return out
