"""SimBox: paths, the simulated state file, the call log and stand-in installation."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import stat
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class StandinError(Exception):
    """A stand-in fails the way the real command does: message on stderr, exit status rc."""

    def __init__(self, msg: str, rc: int = 1):
        super().__init__(msg)
        self.rc = rc


class SimBox:
    def __init__(self, dest: Path, *, gpus: int = 8, vmid: int = 200, box: str = "ct200", host: str = "pve1"):
        self.dest = Path(dest)
        self.gpus, self.vmid, self.box, self.host = gpus, vmid, box, host
        self.inventory_extra: dict[str, dict[str, Any]] = {"host": {}, "container": {}}

    # -- paths -----------------------------------------------------------------------------
    @property
    def host_root(self) -> Path:
        return self.dest / self.host

    @property
    def ct_root(self) -> Path:
        return self.dest / self.box

    @property
    def bin_dir(self) -> Path:
        return self.dest / "bin"

    @property
    def inventory_path(self) -> Path:
        return self.dest / "inventory.yml"

    @property
    def truth_path(self) -> Path:
        """The simulated server's per-request truth (simserver --truth-file), one JSON line each."""
        return self.dest / "sim-truth.jsonl"

    @property
    def state_path(self) -> Path:
        return self.dest / "sim.json"

    @property
    def calls_path(self) -> Path:
        return self.dest / "calls.jsonl"

    def hpath(self, logical: str) -> Path:
        """Real path of a host path, e.g. hpath('/proc/devices')."""
        return self.host_root / logical.lstrip("/")

    def cpath(self, logical: str) -> Path:
        """Real path of a container path."""
        return self.ct_root / logical.lstrip("/")

    # -- lifecycle -------------------------------------------------------------------------
    def create(self, faults: list[str]) -> None:
        for d in (self.host_root, self.ct_root, self.bin_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.state_path.write_text(
            json.dumps(
                {
                    "faults": faults,
                    "gpus": self.gpus,
                    "vmid": self.vmid,
                    "box": self.box,
                    "host": self.host,
                    "created": time.time(),
                    "containers": {},
                    "units": {},
                },
                indent=2,
            )
        )
        self.calls_path.write_text("")

    @classmethod
    def load(cls, dest: Path) -> "SimBox":
        st = json.loads((Path(dest) / "sim.json").read_text())
        return cls(Path(dest), gpus=st["gpus"], vmid=st["vmid"], box=st["box"], host=st["host"])

    # -- state -----------------------------------------------------------------------------
    @contextmanager
    def state(self):
        """Read-modify-write the simulated state under a lock (stand-ins may run concurrently)."""
        with open(self.dest / ".sim.lock", "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            st = json.loads(self.state_path.read_text())
            yield st
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(st, indent=2))
            os.replace(tmp, self.state_path)

    def read_state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())

    @property
    def faults(self) -> set[str]:
        return set(self.read_state()["faults"])

    # -- stand-ins -------------------------------------------------------------------------
    def install_standin(self, name: str) -> Path:
        """bin/<name>: a script that dispatches to gpubox.simbox.cmds.<name>.main(sim, argv)."""
        p = self.bin_dir / name
        pkg_parent = Path(__file__).resolve().parent.parent.parent
        p.write_text(
            f"#!{sys.executable}\n"
            "# gpubox simulation stand-in: records its call, changes the simulated files.\n"
            f"import sys; sys.path.insert(0, {str(pkg_parent)!r})\n"
            "from gpubox.simbox import standin_main\nstandin_main()\n"
        )
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return p

    def record_call(self, prog: str, argv: list[str]) -> None:
        with open(self.calls_path, "a") as f:
            f.write(json.dumps({"t": time.time(), "cmd": prog, "argv": argv}) + "\n")

    def calls(self, prog: str | None = None) -> list[dict[str, Any]]:
        out = [json.loads(l) for l in self.calls_path.read_text().splitlines() if l.strip()]
        return [c for c in out if prog is None or c["cmd"] == prog]

    # -- inventory -------------------------------------------------------------------------
    def write_inventory(self) -> Path:
        host_vars = {
            "ansible_connection": "local",
            "gpubox_root": str(self.host_root),
            "gpubox_bin_dirs": [str(self.bin_dir)],
            "gpubox_simulated": True,
            "gpubox_env": {"GPUBOX_SIM": str(self.dest), "GPUBOX_SIM_SIDE": "host"},
        }
        host_vars.update(self.inventory_extra["host"])
        ct_vars = {
            "ansible_connection": "local",
            "gpubox_root": str(self.ct_root),
            "gpubox_bin_dirs": [str(self.bin_dir)],
            "gpubox_vmid": self.vmid,
            "gpubox_proxmox_host": self.host,
            "gpubox_simulated": True,
            "gpubox_env": {"GPUBOX_SIM": str(self.dest), "GPUBOX_SIM_SIDE": "container"},
        }
        ct_vars.update(self.inventory_extra["container"])
        inv = {
            "all": {
                # its own control-node state (history, backups, results): one box's records
                # never show up as another's (gpubox.cli.adopt_state_dir)
                "vars": {"ansible_python_interpreter": sys.executable, "gpubox_control_state_dir": "state"},
                "children": {
                    "proxmox_hosts": {"hosts": {self.host: host_vars}},
                    "gpu_containers": {"hosts": {self.box: ct_vars}},
                },
            }
        }
        self.inventory_path.write_text("# Written by gpubox's simulated-box builder.\n" + _yaml_dump(inv))
        self._install_gpubox_in_container()
        return self.inventory_path

    def _install_gpubox_in_container(self) -> None:
        """The container as docs/schedule.md asks a real one to be prepared: gpubox at
        /usr/local/bin/gpubox (what install.sh links; here a script running this interpreter's
        gpubox) and an inventory at /etc/gpubox/inventory.yml that reaches the box locally, so the
        timer and hook commands that run gpubox inside the container find it."""
        exe = self.ct_root / "usr/local/bin/gpubox"
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m gpubox.cli "$@"\n')
        exe.chmod(0o755)
        inv = self.ct_root / "etc/gpubox/inventory.yml"
        inv.parent.mkdir(parents=True, exist_ok=True)
        inv.write_text(self.inventory_path.read_text())


def _yaml_dump(doc) -> str:
    """yaml, imported here: the stand-ins, which load this module for every simulated command,
    never write an inventory."""
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)
