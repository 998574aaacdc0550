"""Docker with the NVIDIA Container Toolkit inside the LXC container.

Inside an LXC container the toolkit's hook cannot manage the device cgroup: the container's
cgroup carries the BPF device program LXC attached from the host, and a nested runtime may not
query or replace it, so every `docker run --gpus` fails with
`nvidia-container-cli: mount error: failed to add device rules: unable to find any existing
device filters attached to the cgroup: bpf_prog_query(BPF_CGROUP_DEVICE) failed: operation not
permitted` (NVIDIA/nvidia-container-toolkit#139, #678; NVIDIA/libnvidia-container#154 on a
Proxmox 5.15-pve kernel; #209). The toolkit's documented switch for that is
`no-cgroups = true` in the `[nvidia-container-cli]` table of
/etc/nvidia-container-runtime/config.toml (NVIDIA container toolkit docs, "rootless" and
config.toml reference); the devices are then passed to Docker explicitly or through CDI.

gpubox does not own that file: the finding names the line and the operator's command. The same
step reads the CDI specs in the container (provision.cdi): one that pins an NVIDIA node to a major
that changed breaks CUDA in every container started with it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gpubox.facts import Fact
from gpubox.steps import FAILED, OK, SKIPPED, Finding

from .cdi import REGENERATE, CdiFacts, read_facts, stale_nodes

CONFIG = "/etc/nvidia-container-runtime/config.toml"
CLI_PATHS = ("/usr/bin/nvidia-container-cli", "/usr/local/bin/nvidia-container-cli")
FIX = (
    "in the container: nvidia-ctk config --set nvidia-container-cli.no-cgroups=true --in-place "
    f"(or set `no-cgroups = true` under [nvidia-container-cli] in {CONFIG}), then pass the nodes "
    "to Docker explicitly (--device /dev/nvidia0 ... --device /dev/nvidia-uvm) or use CDI with a spec "
    "written again at every boot (nvidia-ctk cdi generate; the toolkit's nvidia-cdi-refresh units)"
)


DOCKER_CONTAINERS = "/var/lib/docker/containers"
_RULE = re.compile(r"^c\s+(\d+):(\*|\d+)\s+[rwm]+$")


@dataclass
class ToolkitFacts:
    config: str | None = None  # config.toml text, None when absent
    cli: bool = False  # nvidia-container-cli installed
    # Docker containers' DeviceCgroupRules (hostconfig.json), id -> rules, and the char majors of
    # /proc/devices (the host's: an LXC container shares the kernel's table)
    rules: dict[str, list[str]] = field(default_factory=dict)
    proc_devices: str = ""
    cdi: CdiFacts | None = None  # the CDI specs in the container (None: not read)


def stale_rules(rules: dict[str, list[str]], proc_devices: str) -> list[str]:
    """Pure: Docker device-cgroup rules that name a char major no driver holds while an NVIDIA
    dynamic major exists -- a uvm major hard-coded in a compose file / docker run, changed at boot."""
    from .devices import DYNAMIC_NAMES, parse_proc_devices

    majors = parse_proc_devices(proc_devices)
    nvidia = {n: m for n, m in majors.items() if n in DYNAMIC_NAMES}
    if not nvidia:
        return []
    out = []
    for cid, rs in sorted(rules.items()):
        for r in rs:
            m = _RULE.match(r.strip())
            if m and int(m.group(1)) not in majors.values():
                now = ", ".join(f"{n} is {v}" for n, v in sorted(nvidia.items()))
                out.append(
                    f"docker container {cid[:12]} allows `{r.strip()}`: no driver has major {m.group(1)} ({now})"
                )
    return out


def no_cgroups(toml: str) -> bool | None:
    """The `no-cgroups` value of the [nvidia-container-cli] table; None when not set there.
    A small reader on purpose: the file is flat key = value tables, and tomllib is Python 3.11+."""
    table = None
    for raw in toml.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[\s*([^\]]+?)\s*\]", line)
        if m:
            table = m.group(1).strip('"')
            continue
        m = re.fullmatch(r"no-cgroups\s*=\s*(true|false)", line)
        if m and table == "nvidia-container-cli":
            return m.group(1) == "true"
    return None


def decide(f: ToolkitFacts) -> tuple[str, str, str | None, str | None]:
    """Pure: (status, detail, cause, repair)."""
    pinned = stale_nodes(f.cdi) if f.cdi is not None else []
    if pinned:
        return (
            "failed",
            "; ".join(pinned),
            "a CDI spec pins an NVIDIA device node to a major that changed (a reboot or a driver "
            "upgrade hands out dynamic majors anew): containers started with it get a node no driver "
            "answers, so nvidia-smi works and cuInit returns 999",
            f"in the container: write the spec again, {REGENERATE}; remove a stale leftover in "
            "/etc/cdi when /var/run/cdi holds the fresh one; then recreate the containers",
        )
    stale = stale_rules(f.rules, f.proc_devices)
    if stale:
        return (
            "failed",
            "; ".join(stale),
            "a device-cgroup rule with a hard-coded nvidia-uvm major: the major changed at boot, so the "
            "Docker container cannot open /dev/nvidia-uvm (CUDA error 999)",
            "give Docker the device instead of a major (--device /dev/nvidia-uvm, compose `devices:`), or "
            "use CDI with a spec written again at every boot (nvidia-ctk cdi generate; the toolkit's "
            "nvidia-cdi-refresh units); recreate the container",
        )
    if f.config is None and not f.cli:
        return "ok", "no NVIDIA Container Toolkit in the container", None, None
    if f.config is None:
        return (
            "failed",
            f"nvidia-container-cli is installed but {CONFIG} is missing: it manages device cgroups "
            "(no-cgroups defaults to false)",
            "inside LXC the toolkit cannot set device rules: docker --gpus fails with "
            "'bpf_prog_query(BPF_CGROUP_DEVICE) failed: operation not permitted'",
            FIX,
        )
    val = no_cgroups(f.config)
    if val:
        return "ok", "NVIDIA Container Toolkit set up for LXC (no-cgroups = true)", None, None
    state = "no-cgroups = false" if val is False else "no-cgroups not set (default false)"
    return (
        "failed",
        f"NVIDIA Container Toolkit in an LXC container with {state} in {CONFIG}",
        "inside LXC the toolkit cannot set device rules: docker --gpus fails with "
        "'bpf_prog_query(BPF_CGROUP_DEVICE) failed: operation not permitted'",
        FIX,
    )


class ToolkitFact(Fact):
    where = "container"

    @staticmethod
    def read(host) -> ToolkitFacts:
        text = host.read_text(CONFIG, default=None) if host.exists(CONFIG) else None
        rules: dict[str, list[str]] = {}
        if host.exists(DOCKER_CONTAINERS):
            for cid in sorted(host.listdir(DOCKER_CONTAINERS))[:200]:
                raw = host.read_text(f"{DOCKER_CONTAINERS}/{cid}/hostconfig.json", default="")
                try:
                    got = (json.loads(raw) if raw else {}).get("DeviceCgroupRules") or []
                except (ValueError, AttributeError):
                    continue
                if isinstance(got, list) and got:
                    rules[cid] = [str(r) for r in got]
        specs = read_facts(host)
        proc = specs.proc_devices or (host.read_text("/proc/devices", default="") if rules else "")
        return ToolkitFacts(text, any(host.exists(p) for p in CLI_PATHS), rules, proc, specs)


def finding_of(status: str, detail: str, cause, repair, ev) -> Finding:
    """A (status, detail, cause, repair) decision of this module or provision.shmroom as the step's
    Finding: these diagnoses report, they plan nothing."""
    if status == OK:
        return Finding.ok(detail, evidence=ev)
    if status == FAILED:
        return Finding.failed(detail, cause=cause, repair=repair, evidence=ev)
    return Finding(SKIPPED, detail, ev)
