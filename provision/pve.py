"""Container control: status, start, stop, reboot, lock check.

Through the Proxmox API with proxmoxer when the Proxmox host entry has `gpubox_api` (token secret
read from the environment variable `gpubox_api_token_env` names; tasks are waited on by UPID with
a timeout, docs/facts.md "proxmoxer 2.x"), else with `pct` over the host's own transport (SSH or local).
Both refuse to act on a config carrying `lock:` (a backup/snapshot/migration is running).
"""

from __future__ import annotations

import os
import re
import time

from gpubox.errors import GpuboxError, TransportError

from .lxcconf import read_conf

ACTIONS = ("start", "stop", "reboot")


class Control:
    kind = "?"

    def __init__(self, vmid: int, timeout: float = 120):
        self.vmid = int(vmid)
        self.timeout = timeout

    def ident(self) -> tuple:
        """Which container through which channel: equal controls read the same status (a fact
        cached per run takes the control as its argument)."""
        return (self.kind, self.vmid)

    def __eq__(self, other) -> bool:
        return isinstance(other, Control) and self.ident() == other.ident()

    def __hash__(self) -> int:
        return hash(self.ident())

    def status(self) -> dict:
        """{'status': 'running'|'stopped'|..., 'lock': str|None}"""
        raise NotImplementedError

    def _do(self, action: str) -> None:
        raise NotImplementedError

    def describe(self, action: str) -> list[str]:
        """What `action` runs, as an argv-like list for plans."""
        raise NotImplementedError

    def act(self, action: str) -> None:
        if action not in ACTIONS:
            raise ValueError(action)
        st = self.status()
        if action == "stop" and st.get("status") == "stopped":
            return  # pct/API would fail "CT <vmid> not running" (pve-container Status.pm vm_stop)
        if action == "reboot" and st.get("status") == "stopped":
            action = "start"  # reboot fails "VM <vmid> not running" on a stopped CT (Status.pm vm_reboot)
        if action == "start" and st.get("status") == "running":
            return  # "CT <vmid> already running" (Status.pm vm_start)
        # Checked here for every action: `pct reboot` itself does not check the lock (LXC.pm
        # vm_reboot), it stops the CT and then lxc-pve-prestart-hook refuses to start it again.
        if st.get("lock"):
            raise GpuboxError(
                f"CT {self.vmid} is locked ({st['lock']}); not running {action}",
                "wait for the backup/snapshot/migration to finish; `pct unlock` only if none runs",
            )
        self._do(action)
        want = "stopped" if action == "stop" else "running"
        deadline = time.monotonic() + self.timeout
        while self.status().get("status") != want:
            if time.monotonic() > deadline:
                raise GpuboxError(
                    f"CT {self.vmid} is not {want} {self.timeout:g} s after {action}",
                    "look at the task log on the Proxmox host (journalctl, pct start --debug)",
                )
            time.sleep(0.2)


class PctControl(Control):
    """`pct` on the Proxmox host (as root)."""

    kind = "pct"

    def __init__(self, host, vmid: int, timeout: float = 120):
        super().__init__(vmid, timeout)
        self.host = host

    def status(self) -> dict:
        r = self.host.run(["pct", "status", str(self.vmid)], become=True, timeout=30).check()
        # pve-container src/PVE/CLI/pct.pm `status`: prints exactly "status: <running|stopped|..>\n"
        # on stdout (config warnings, if any, go to stderr).
        m = re.search(r"^status: (\S+)$", r.stdout, re.M)
        status = m.group(1) if m else "unknown"
        conf, _ = read_conf(self.host, self.vmid)
        return {"status": status, "lock": conf.lock}

    def ident(self) -> tuple:
        return (self.kind, self.host.name, self.host.root, self.vmid)

    def describe(self, action: str) -> list[str]:
        return ["pct", action, str(self.vmid)]

    def _do(self, action: str) -> None:
        self.host.run(self.describe(action), become=True, timeout=self.timeout).check()


class ApiControl(Control):
    """Proxmox VE API through proxmoxer (https backend, API token)."""

    kind = "api"

    def __init__(self, api: dict, secret: str, node: str, vmid: int, timeout: float = 120, poll: float = 0.5):
        super().__init__(vmid, timeout)
        from proxmoxer import ProxmoxAPI

        self.node, self.poll = node, poll
        verify = api.get("verify_ssl", True)
        self.where = f"{api['host']}:{api.get('port', 8006)}"
        self.prox = ProxmoxAPI(
            str(api["host"]),
            port=int(api.get("port", 8006)),
            user=str(api["user"]),
            token_name=str(api["token_name"]),
            token_value=secret,
            verify_ssl=verify,
            timeout=int(api.get("timeout", 10)),
        )

    @property
    def _ct(self):
        return self.prox.nodes(self.node).lxc(self.vmid)

    def _call(self, what: str, fn):
        import requests
        from proxmoxer.core import ResourceException

        try:
            return fn()
        except ResourceException as exc:
            raise GpuboxError(
                f"Proxmox API {what} for CT {self.vmid} failed: {exc}",
                "check the token's privileges (VM.PowerMgmt, VM.Audit) and the task log",
            ) from None
        except requests.exceptions.SSLError:
            raise TransportError(
                f"Proxmox API at {self.where}: TLS certificate not trusted",
                "set gpubox_api.verify_ssl to the CA file of the PVE certificate",
            ) from None
        except requests.exceptions.RequestException as exc:
            raise TransportError(
                f"Proxmox API at {self.where} unreachable: {type(exc).__name__}",
                "check gpubox_api host/port and that pveproxy runs",
            ) from None

    def status(self) -> dict:
        d = self._call("status", lambda: self._ct.status.current.get())
        return {"status": d.get("status", "unknown"), "lock": d.get("lock") or None}

    def config(self) -> dict:
        """GET config: keys, `lxc` as [[key, value], ...] and `digest` (SHA-1 of the file)."""
        return self._call("config", lambda: self._ct.config.get())

    def ident(self) -> tuple:
        return (self.kind, self.where, self.node, self.vmid)

    def describe(self, action: str) -> list[str]:
        return ["POST", f"/api2/json/nodes/{self.node}/lxc/{self.vmid}/status/{action}"]

    def _do(self, action: str) -> None:
        from proxmoxer.tools import Tasks

        upid = self._call(action, lambda: getattr(self._ct.status, action).post())
        res = self._call(
            "task status",
            lambda: Tasks.blocking_status(self.prox, upid, timeout=self.timeout, polling_interval=self.poll),
        )
        if res is None:
            raise GpuboxError(
                f"task {upid} ({action} CT {self.vmid}) did not finish in {self.timeout:g} s",
                "look at the task log in the Proxmox UI; raise gpubox_api.timeout",
            )
        # pve-common UPID.pm status_is_error: "OK" and "WARNINGS: <n>" are success, anything
        # else is the task's error message (pve-manager API2/Tasks.pm read_task_status).
        exitstatus = str(res.get("exitstatus"))
        if not (exitstatus == "OK" or re.match(r"^WARNINGS: \d+$", exitstatus)):
            raise GpuboxError(
                f"{action} CT {self.vmid} failed: {res.get('exitstatus')}",
                "look at the task log in the Proxmox UI",
            )


def control_for(ctx) -> Control:
    """The API when the Proxmox host entry has gpubox_api, else pct over the host transport."""
    host_entry = ctx.box.host
    api = host_entry.get("gpubox_api")
    timeout = float(ctx.box.var("gpubox_ct_timeout", 120))
    if not api:
        return PctControl(ctx.host, ctx.box.vmid, timeout)
    if not isinstance(api, dict) or not all(api.get(k) for k in ("host", "user", "token_name")):
        raise GpuboxError(
            f"{host_entry.name}: gpubox_api needs host, user and token_name",
            "see inventory/example.yml, or remove gpubox_api to use pct over SSH",
        )
    env = host_entry.get("gpubox_api_token_env") or ctx.box.var("gpubox_api_token_env")
    if not env:
        raise GpuboxError(
            f"{host_entry.name}: gpubox_api is set but gpubox_api_token_env is not",
            "set gpubox_api_token_env to the name of the env var holding the token secret",
        )
    secret = os.environ.get(str(env))
    if not secret:
        raise GpuboxError(
            f"environment variable {env} (the Proxmox API token secret) is not set",
            f"export {env}=<secret of token {api['user']}!{api['token_name']}>",
        )
    node = str(host_entry.get("gpubox_proxmox_node") or host_entry.name)
    return ApiControl(
        api, secret, node, ctx.box.vmid, float(api.get("task_timeout", timeout)), float(api.get("poll", 0.5))
    )
