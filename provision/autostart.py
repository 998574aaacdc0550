"""Zero-touch reboot: what `gpubox autostart install` puts on a Proxmox host, as pure text.

Proxmox starts a container in this order (pve-container src/PVE/LXC.pm, vm_start): pending changes
applied, `update_lxc_config` writes /var/lib/lxc/<vmid>/config from /etc/pve/lxc/<vmid>.conf, the
guest hookscript runs with `<script> <vmid> pre-start` (a non-zero exit aborts the start),
`systemctl start pve-container@<vmid>`, then `<script> <vmid> post-start` (its failure is only
warned about). So an edit of the config in pre-start reaches only the NEXT start. gpubox therefore
installs three things:

    gpubox-autostart-ct<vmid>.service   host unit, After=pve-cluster Before=pve-guests: device
                                        nodes, host tuning and the container's NVIDIA lines fixed
                                        against the live /proc/devices before any onboot start
    <storage>:snippets/gpubox-ct<vmid>.sh   the hookscript (pct set <vmid> --hookscript ...): one
                                        exec of gpubox, which runs the phase with the library's
                                        own steps (provision.autostart_hook)
    <server unit>.d/gpubox-autostart.conf   (with server_unit) in the container: the server starts
                                        only on staged weights; post-start starts it after staging

Inventory (all optional; CLI options win):

    gpubox_autostart:
      policy: degrade            # pre-start when the box cannot be made right: refuse | degrade
      storage: local             # a storage with snippets content (local -> /var/lib/vz/snippets)
      existing: chain            # a hookscript of the user's: chain (run it first) | refuse
      server_unit: vllm.service  # the inference server's unit in the container
      profile: health            # the post-start health check's benchmark profile
      pre_timeout: 5min          # time limit of pre-start and of the boot unit
      post_timeout: 1h           # time limit of post-start (staging + health check)
      gpubox: /usr/local/bin/gpubox             # gpubox on the Proxmox host
      inventory: /etc/gpubox/inventory.yml      # the inventory gpubox reads there
      state_dir: /var/lib/gpubox                # history there (GPUBOX_STATE_DIR)
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.bench.schedule import format_span, parse_span, safe_token
from gpubox.errors import GpuboxError

POLICIES = ("refuse", "degrade")
# degrade: a container gpubox cannot fix still starts (the post-start reports it to history, metrics
# and the alert hook); gpubox never holds a guest down that Proxmox would have started without it.
DEFAULT_POLICY = "degrade"
UNIT_DIR = "/etc/systemd/system"
LOG_DIR = "/var/log/gpubox"
DROPIN = "gpubox-autostart.conf"
RECORD = "# gpubox-previous-hookscript: "  # the snippet's record of the line it replaced (JSON)
DEFAULTS = {
    "policy": DEFAULT_POLICY,
    "storage": "local",
    "existing": "chain",
    "server_unit": None,
    "profile": "health",
    "pre_timeout": "5min",
    "post_timeout": "1h",
    "gpubox": "/usr/local/bin/gpubox",
    "inventory": "/etc/gpubox/inventory.yml",
    "state_dir": "/var/lib/gpubox",
}
# Steps of each phase (whole step names of the recover pipeline, gpubox.areas.PIPELINE).
HOST_STEPS = ("host-devices", "container-config", "pcie-mrrs", "numa-balancing")
PRE_START_STEPS = ("host-devices", "container-config")
_UNIT = re.compile(r"^[A-Za-z0-9_.@:-]+\.service$")


@dataclass
class Spec:
    """One box's autostart, validated."""

    box: str
    vmid: int
    policy: str = DEFAULT_POLICY
    storage: str = "local"
    existing: str = "chain"
    server_unit: str | None = None
    profile: str = "health"
    pre_timeout: int = 300
    post_timeout: int = 3600
    gpubox: str = DEFAULTS["gpubox"]
    inventory: str = DEFAULTS["inventory"]
    state_dir: str | None = DEFAULTS["state_dir"]

    @property
    def base(self) -> str:
        return f"gpubox-autostart-ct{self.vmid}"

    @property
    def unit(self) -> str:
        return self.base + ".service"

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit}"

    @property
    def snippet_name(self) -> str:
        return f"gpubox-ct{self.vmid}.sh"

    @property
    def volid(self) -> str:
        return f"{self.storage}:snippets/{self.snippet_name}"

    @property
    def log_path(self) -> str:
        return f"{LOG_DIR}/autostart-ct{self.vmid}.log"

    @property
    def dropin_path(self) -> str | None:
        return f"{UNIT_DIR}/{self.server_unit}.d/{DROPIN}" if self.server_unit else None

    def gpubox_argv(self) -> list[str]:
        return [self.gpubox, "-i", self.inventory, "autostart"]


def spec_from(box, inventory_path: str | None = None, **cli: Any) -> Spec:
    """CLI options over the box's gpubox_autostart over the defaults, validated (one line, exit 2).
    A simulated box runs this gpubox with this inventory (there is no /usr/local/bin/gpubox of its own)."""
    inv = box.var("gpubox_autostart") or {}
    if not isinstance(inv, dict):
        raise GpuboxError(f"box {box.name}: gpubox_autostart is not a mapping", "see docs/autostart.md")
    unknown = sorted(set(inv) - set(DEFAULTS))
    if unknown:
        raise GpuboxError(
            f"gpubox_autostart.{unknown[0]} is not a setting", f"known: {', '.join(sorted(DEFAULTS))}"
        )
    cfg = dict(DEFAULTS)
    if box.var("gpubox_simulated", False):
        cfg["gpubox"] = str(Path(sys.executable).parent / "gpubox")
        cfg["inventory"] = str(Path(inventory_path).resolve()) if inventory_path else cfg["inventory"]
        cfg["state_dir"] = None  # the env of whoever starts the container (`gpubox sim reboot`)
    cfg.update({k: v for k, v in inv.items() if v is not None})
    cfg.update({k: v for k, v in cli.items() if v is not None})
    if cfg["policy"] not in POLICIES:
        raise GpuboxError(f"autostart policy {cfg['policy']!r} is not known", "use refuse or degrade")
    if cfg["existing"] not in ("chain", "refuse"):
        raise GpuboxError(f"autostart existing {cfg['existing']!r} is not known", "use chain or refuse")
    if cfg["server_unit"] is not None and not _UNIT.match(str(cfg["server_unit"])):
        raise GpuboxError(
            f"server_unit {cfg['server_unit']!r} is not a service unit name", "e.g. vllm.service"
        )
    if not re.match(r"^[A-Za-z][A-Za-z0-9_.-]*$", str(cfg["storage"])):
        raise GpuboxError(f"storage {cfg['storage']!r} is not a Proxmox storage id", "e.g. local")
    for k in ("gpubox", "inventory") + (("state_dir",) if cfg["state_dir"] else ()):
        safe_token(cfg[k], f"gpubox_autostart.{k}")
        if not str(cfg[k]).startswith("/"):
            raise GpuboxError(f"gpubox_autostart.{k} {cfg[k]!r} is not an absolute path", "give one")
    safe_token(cfg["profile"], "autostart profile")
    safe_token(box.name, "box name")
    return Spec(
        box=box.name,
        vmid=int(box.vmid),
        policy=cfg["policy"],
        storage=str(cfg["storage"]),
        existing=cfg["existing"],
        server_unit=cfg["server_unit"],
        profile=str(cfg["profile"]),
        pre_timeout=parse_span(cfg["pre_timeout"], "pre_timeout"),
        post_timeout=parse_span(cfg["post_timeout"], "post_timeout"),
        gpubox=str(cfg["gpubox"]),
        inventory=str(cfg["inventory"]),
        state_dir=cfg["state_dir"],
    )


# -- where a hookscript volume lives (pvesm path) ------------------------------------------------
def storage_paths(storage_cfg: str) -> dict[str, str]:
    """Directory storages of /etc/pve/storage.cfg (pve-storage: `dir: <id>` then indented
    `path <dir>`), with Proxmox's built-in `local` -> /var/lib/vz when the file does not say."""
    out: dict[str, str] = {"local": "/var/lib/vz"}
    cur = None
    for line in storage_cfg.splitlines():
        m = re.match(r"^(\w+):\s*(\S+)\s*$", line)
        if m:
            cur = m.group(2) if m.group(1) == "dir" else None
            continue
        m = re.match(r"^\s+path\s+(\S+)\s*$", line)
        if m and cur:
            out[cur] = m.group(1)
    return out


def volid_path(volid: str, storage_cfg: str) -> str | None:
    """`<storage>:snippets/<file>` -> the file's path on the host; None when not a directory storage."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9_.-]*):snippets/([^/]+)$", volid.strip())
    if not m:
        return None
    base = storage_paths(storage_cfg).get(m.group(1))
    return f"{base.rstrip('/')}/snippets/{m.group(2)}" if base else None


def snippet_path(s: Spec, storage_cfg: str) -> str:
    p = volid_path(s.volid, storage_cfg)
    if p is None:
        raise GpuboxError(
            f"storage {s.storage!r} is not a directory storage in /etc/pve/storage.cfg",
            "use a storage with snippets content, e.g. local (/var/lib/vz/snippets)",
        )
    return p


def hookscript_line(conf_text: str) -> str | None:
    """The main section's `hookscript:` line as it stands in the file (None: there is none).
    Lines before the first `[...]` header are the main section (pve-container Config.pm)."""
    for line in conf_text.splitlines(keepends=True):
        if line.startswith("["):
            break
        if re.match(r"^hookscript:", line):
            return line
    return None


def hookscript_value(line: str | None) -> str | None:
    return None if line is None else line.split(":", 1)[1].strip()


# -- the files ----------------------------------------------------------------------------------
def render_snippet(s: Spec, previous: str | None, chain: str | None) -> str:
    """The hookscript: one exec of gpubox, so every phase is the library's code (the same steps,
    option gate and box lock as `gpubox recover`), never a second implementation in shell."""
    argv = s.gpubox_argv() + ["hook", s.box, "--policy", s.policy]  # install's choices travel with it
    if s.server_unit:
        argv += ["--server-unit", s.server_unit]
    if chain:
        argv += ["--chain", chain]
    env = f"GPUBOX_STATE_DIR={s.state_dir} " if s.state_dir else ""
    return (
        "#!/bin/sh\n"
        f"# Written by gpubox (gpubox autostart install {s.box}); remove with: gpubox autostart remove {s.box}\n"
        "# Proxmox calls it as <script> <vmid> <phase> (pve-container src/PVE/LXC.pm vm_start).\n"
        f"{RECORD}{json.dumps(previous)}\n"
        # gpubox uninstalled must never stop the guest from starting: say so and let it start
        f'[ -x {s.gpubox} ] || {{ echo "gpubox autostart: {s.gpubox} missing: CT $1 $2 not checked" >&2; exit 0; }}\n'
        f'exec /usr/bin/env {env}{" ".join(argv)} "$@"\n'
    )


def recorded_previous(snippet: str | None) -> tuple[bool, str | None]:
    """(found, line): the `hookscript:` line gpubox's snippet replaced, None when there was none."""
    for line in (snippet or "").splitlines():
        if line.startswith(RECORD):
            try:
                v = json.loads(line[len(RECORD) :])
            except ValueError:
                return False, None
            return (True, v) if v is None or isinstance(v, str) else (False, None)
    return False, None


def render_unit(s: Spec) -> str:
    argv = s.gpubox_argv() + ["boot", s.box]
    env = f"Environment=GPUBOX_STATE_DIR={s.state_dir}\n" if s.state_dir else ""
    return (
        f"# Written by gpubox (gpubox autostart install {s.box}); remove with: gpubox autostart remove {s.box}\n"
        "[Unit]\n"
        f"Description=gpubox: GPU nodes, host tuning and CT {s.vmid}'s NVIDIA lines before the guests start\n"
        "Documentation=https://pve.proxmox.com/pve-docs/pct.1.html\n"
        # pmxcfs must be up to read and write /etc/pve; pve-guests starts the onboot containers.
        # No udev settling (systemd-udev-settle.service is deprecated): the boot steps create the
        # device nodes they need themselves (host-devices) and judge the live /proc/devices.
        "After=pve-cluster.service systemd-modules-load.service\n"
        "Wants=pve-cluster.service\n"
        "Before=pve-guests.service\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"{env}"
        f"ExecStart={' '.join(argv)}\n"
        f"TimeoutStartSec={s.pre_timeout}\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def gate_paths(box) -> list[str]:
    """The staged manifests the server needs: written last by the copier (provision.stage), so
    their presence means a complete, verified copy in /dev/shm."""
    from .stage import MANIFEST

    out = []
    for var in ("gpubox_model", "gpubox_drafter"):
        v = box.var(var)
        dest = v.get("dest") if isinstance(v, dict) else None
        if dest:
            out.append(f"{str(dest).rstrip('/')}/{MANIFEST}")
    return out


def render_dropin(s: Spec, gates: list[str]) -> str:
    conds = "".join(f"ConditionPathExists={p}\n" for p in gates)
    return (
        f"# Written by gpubox (gpubox autostart install {s.box}): {s.server_unit} starts only on staged\n"
        "# weights; after a reboot /dev/shm is empty and gpubox's post-start hook stages them, then starts it.\n"
        "[Unit]\n"
        f"{conds}"
    )


def describe(s: Spec) -> str:
    return (
        f"boot unit {s.unit}, hookscript {s.volid} (pre-start policy {s.policy}, "
        f"limits {format_span(s.pre_timeout)}/{format_span(s.post_timeout)})"
        + (f", {s.server_unit} gated on staging" if s.server_unit else "")
    )
