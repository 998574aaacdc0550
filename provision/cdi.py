"""CDI specs inside the container that pin an NVIDIA device node to a major number.

Docker (and podman, containerd) with CDI reads the specs in /etc/cdi and /var/run/cdi (the
Container Device Interface's default spec directories; a spec in /var/run/cdi overrides one in
/etc/cdi that defines the same kind) and creates each `deviceNodes` entry in the container as
written. An entry may give `major`/`minor`; then the runtime makes the node with that number
instead of the host node's. The dynamic majors (nvidia-uvm, nvidia-caps, nvidia-nvlink,
nvidia-nvswitch: fs/char_dev.c hands them out at module load) change with the kernel and driver,
so a spec written before a reboot or an upgrade names a major no driver holds any more: `nvidia-smi`
works, `cuInit` returns 999 (NVIDIA/nvidia-container-toolkit#1934: "the toolkit writes the wrong
number into both" nvidia-uvm entries of /etc/cdi/nvidia.yaml, fixed there by hand; NVIDIA/NemoClaw#4733:
"a stale /etc/cdi/nvidia.yaml (e.g. an nvidia-uvm device major that drifted after a driver change)
silently injects the wrong device and breaks CUDA").

gpubox does not own the spec: the finding names the file, the entry and the command that writes
it again (`nvidia-ctk cdi generate`), and the refresh units the toolkit ships for that.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field

import yaml

from gpubox.errors import GpuboxError

from .devices import DYNAMIC_NAMES, FRONTEND_MAJOR, parse_proc_devices

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # lowest priority first (CDI spec, "Spec directories")
SPEC_LIMIT = 4 << 20  # a generated nvidia.yaml lists devices and libraries: ~100 KB
MAX_SPECS = 64
REGENERATE = (
    "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml (or enable the toolkit's "
    "nvidia-cdi-refresh.path/.service, which rewrite it at boot and on driver changes), then compare "
    "its nvidia-uvm major with `grep nvidia-uvm /proc/devices` (toolkit 1.19.1 wrote a fixed 510, "
    "NVIDIA/nvidia-container-toolkit#1934: correct the major in the spec by hand there)"
)


@dataclass
class CdiSpec:
    path: str
    text: str | None = None  # None: unreadable (the reason in `error`)
    error: str | None = None


@dataclass
class CdiFacts:
    specs: list[CdiSpec] = field(default_factory=list)
    proc_devices: str = ""  # /proc/devices (the host kernel's table: a container shares it)


def node_driver(path: str) -> str | None:
    """The /proc/devices name whose major a device node carries (None: not an NVIDIA node)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if name in ("nvidia-uvm", "nvidia-uvm-tools"):
        return "nvidia-uvm"
    if path.startswith("/dev/nvidia-caps/") or name.startswith("nvidia-cap"):
        return "nvidia-caps"
    for n in ("nvidia-nvswitch", "nvidia-nvlink"):
        if name.startswith(n):
            return n
    if name in ("nvidiactl", "nvidia-modeset") or (name.startswith("nvidia") and name[6:].isdigit()):
        return "nvidia"
    return None


def _nodes(doc) -> list[dict]:
    """Every deviceNodes entry of a spec: the spec's own containerEdits and each device's."""
    if not isinstance(doc, dict):
        return []
    edits = [doc.get("containerEdits")]
    edits += [d.get("containerEdits") for d in doc.get("devices") or [] if isinstance(d, dict)]
    out = []
    for e in edits:
        if isinstance(e, dict):
            out += [n for n in e.get("deviceNodes") or [] if isinstance(n, dict)]
    return out


def _load(text: str):
    try:
        return yaml.safe_load(text)  # a JSON spec is YAML too
    except yaml.YAMLError:
        return None


def effective(specs: list[CdiSpec]) -> list[tuple[CdiSpec, object]]:
    """(spec, document) of the specs the runtime uses: of two that define the same kind, the one in
    the later directory wins (SPEC_DIRS order); an unparsable spec is kept (the runtime refuses it)."""
    docs = [(s, _load(s.text or "")) for s in specs if s.text is not None]
    last_dir: dict[str, str] = {}
    for s, d in docs:
        kind = d.get("kind") if isinstance(d, dict) else None
        if isinstance(kind, str):
            last_dir[kind] = s.path.rsplit("/", 1)[0]
    out = []
    for s, d in docs:
        kind = d.get("kind") if isinstance(d, dict) else None
        if isinstance(kind, str) and last_dir[kind] != s.path.rsplit("/", 1)[0]:
            continue  # overridden by a spec of the same kind in a later directory
        out.append((s, d))
    return out


def stale_nodes(f: CdiFacts) -> list[str]:
    """Pure: one line per deviceNodes entry of an effective spec whose major no driver of that name
    holds now (e.g. `/etc/cdi/nvidia.yaml: /dev/nvidia-uvm major 510, the driver's is 509`)."""
    majors = parse_proc_devices(f.proc_devices)
    if not any(n in majors for n in DYNAMIC_NAMES):
        return []  # no NVIDIA driver loaded (or no /proc/devices): nothing to compare against
    out = []
    for spec, doc in effective(f.specs):
        for n in _nodes(doc):
            path = n.get("hostPath") or n.get("path")
            major = n.get("major")
            if not isinstance(path, str) or isinstance(major, bool) or not isinstance(major, int):
                continue
            drv = node_driver(path)
            if drv is None:
                continue
            now = FRONTEND_MAJOR if drv == "nvidia" else majors.get(drv)
            if now is not None and major != now:
                out.append(f"{spec.path}: {path} major {major}, the driver's is {now}")
            elif now is None:
                out.append(f"{spec.path}: {path} major {major}, no {drv} driver is loaded")
    return out


def read_facts(host) -> CdiFacts:
    """The spec files of SPEC_DIRS (regular files, bounded), and /proc/devices when there are any.
    /var/run is a link to /run on systemd distributions: read through /run then."""
    specs: list[CdiSpec] = []
    for d in SPEC_DIRS:
        if d == "/var/run/cdi":
            st = host.stat("/var/run")
            if st is not None and stat.S_ISLNK(st.mode):
                d = "/run/cdi"
        try:
            names = sorted(host.listdir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in [n for n in names if n.endswith((".yaml", ".yml", ".json"))][:MAX_SPECS]:
            path = f"{d}/{name}"
            try:
                specs.append(CdiSpec(path, host.read_bounded(path, SPEC_LIMIT).decode("utf-8", "replace")))
            except OSError as exc:
                specs.append(CdiSpec(path, None, exc.strerror or str(exc)))
            except GpuboxError as exc:  # a link or a FIFO where a spec should be: not read
                specs.append(CdiSpec(path, None, exc.problem))
    proc = host.read_text("/proc/devices", default="") if specs else ""
    return CdiFacts(specs, proc)
