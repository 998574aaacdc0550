"""The simulated container's CUDA: what `provision/cuda_probe.py` finds there, from the simulated
state, and the container's `python3` that answers for it.

The real probe opens the NVIDIA nodes, calls cuInit(0) through libcuda.so.1 and counts devices
through NVML; none of that exists here. The simulated box puts a `python3` stand-in first on its
hosts' PATH (gpubox_bin_dirs). It runs every command with the python3 that comes next on PATH,
unchanged, except one: the CUDA probe's payload in the container (gpubox.transport.payload: the
runner's argv for gpubox.provision.cuda_probe, a zip on stdin that holds exactly the probe's
source). That one runs the shipped source's own `run()` with `sim_env`'s reads instead of the real box's: the
nodes are opened as the kernel would decide (the device cgroup is checked before the driver: EPERM
before ENXIO; ENOENT when the node is absent), cuInit's code follows from what opened (uvm denied:
999 CUDA_ERROR_UNKNOWN; no usable GPU node: 100; the library's version not the kernel module's:
803) and NVML counts the GPU nodes that open. So the file shipped to a real container holds no
simulation, and the simulated one still runs its real parsing and classification.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import zipfile
from pathlib import Path

from ..provision.cuda_probe import CU_NAMES, NOTDEV, _not_a_device, kernel_version, lib_version
from ..transport import payload
from .core import SimBox

FAULTS: dict[str, str] = {}


def build(sim: SimBox, faults: set[str]) -> None:
    """bin/python3: the simulated hosts' python3 (see the module's docstring)."""
    p = sim.bin_dir / "python3"
    pkg_parent = Path(__file__).resolve().parent.parent.parent
    p.write_text(
        f"#!{sys.executable}\n"
        "# gpubox simulation stand-in: the simulated hosts' python3 (gpubox/simbox/cuda.py).\n"
        f"import sys; sys.path.insert(0, {str(pkg_parent)!r})\n"
        "from gpubox.simbox.python3 import main\nmain()\n"
    )
    p.chmod(0o755)


def shipped(stream: bytes, module: str) -> bytes | None:
    """MODULE's source in the payload on stdin (None: not a payload that holds it)."""
    try:
        return payload.unpack(stream)[0].get(module)
    except (ValueError, zipfile.BadZipFile):
        return None


def simulated_probe(src: str, args: list[str]) -> int:
    """The shipped probe's source, run here with the simulated reads; prints what its __main__ does."""
    shipped: dict = {"__name__": "cuda_probe"}
    exec(compile(src, "<stdin>", "exec"), shipped)
    sim_dir = os.environ.get("GPUBOX_SIM") or str(Path(sys.argv[0]).resolve().parent.parent)
    sys.argv = ["cuda_probe", *args]  # as the payload's loader sets it: run() reads extra node paths there
    json.dump(shipped["run"](sim_env(sim_dir)), sys.stdout)
    sys.stdout.write("\n")
    return 0


def sim_env(sim_dir):
    """(open, cuda, nvml, version file) for cuda_probe.run(): the answers of the simulated state."""
    st = json.load(open(os.path.join(sim_dir, "sim.json")))
    host_root, ct_root = os.path.join(sim_dir, st["host"]), os.path.join(sim_dir, st["box"])
    ct = st["containers"][str(st["vmid"])]
    majors = set()
    in_char = False
    for line in open(os.path.join(host_root, "proc/devices")):
        s = line.strip()
        if s.endswith(":"):
            in_char = s == "Character devices:"
        elif in_char and s:
            majors.add(int(s.split()[0]))

    def parse(strings):
        out = []
        for r in strings:
            m = re.match(r"^([ac])(?:\s+(\*|\d+):(\*|\d+)\s*([rwm]*))?$", r.strip())
            if m:
                out.append(m.groups())
        return out

    rules = parse(ct["cgroup_allow"])
    live = parse(ct["cgroup_allow"][ct.get("start_rules", len(ct["cgroup_allow"])) :])  # lxc-cgroup

    def allowed(ma, mi, live_only=False):
        for kind, rma, rmi, acc in live if live_only else rules:
            if kind == "a" and rma is None:
                return True
            if rma in ("*", str(ma)) and rmi in ("*", str(mi)) and "r" in acc and "w" in acc:
                return True
        return False

    def sim_open(path):
        p = os.path.join(ct_root, path.lstrip("/"))
        if ct["status"] != "running" or not os.path.exists(p):
            return errno.ENOENT
        if _not_a_device(p):
            return NOTDEV
        rdev = os.stat(p).st_rdev
        ma, mi = os.major(rdev), os.minor(rdev)
        real = (ct.get("real_nodes") or {}).get(path)
        if real and real[1:] == [ma, mi]:  # a real LXC container answered at start (simbox.lxcreal)
            if real[0] == "mode":
                return errno.EACCES
            if real[0] != "rw" and not allowed(ma, mi, live_only=True):
                return errno.EPERM
        elif not allowed(ma, mi):
            return errno.EPERM  # the device cgroup is checked before the driver
        if ma not in majors:
            return errno.ENXIO  # no driver registered at this major any more
        return 0

    def sim_cuda(opened):
        lib = os.path.join(ct_root, "usr/lib/x86_64-linux-gnu/libcuda.so.1")
        if not os.path.exists(lib):
            return {
                "cuinit": None,
                "cuinit_name": None,
                "libcuda": None,
                "cuda_error": "libcuda.so.1 not found",
            }
        real = os.path.realpath(lib)
        kv = kernel_version(open(os.path.join(ct_root, "proc/driver/nvidia/version")).read())
        if opened["/dev/nvidiactl"] or opened["/dev/nvidia0"]:
            rc = 100
        elif opened["/dev/nvidia-uvm"]:
            rc = 999
        elif lib_version(real) != kv:
            rc = 803
        else:
            rc = 0
        return {"cuinit": rc, "cuinit_name": CU_NAMES[rc], "libcuda": real, "cuda_error": None}

    def sim_nvml(opened):
        if opened["/dev/nvidiactl"]:
            return {"count": None, "error": "nvmlInit_v2 returned 9"}  # NVML_ERROR_DRIVER_NOT_LOADED
        n = sum(
            1
            for x in os.listdir(os.path.join(ct_root, "dev"))
            if re.match(r"^nvidia\d+$", x) and sim_open("/dev/" + x) == 0
        )
        return {"count": n, "error": None}

    return sim_open, sim_cuda, sim_nvml, os.path.join(ct_root, "proc/driver/nvidia/version")
