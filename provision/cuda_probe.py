"""In-container CUDA probe. STANDALONE and stdlib-only: this module runs as a payload
(gpubox.transport.payload) with the container's python3 (the container has no gpubox) and prints
one JSON object.

It opens the NVIDIA nodes and classifies the errno (docs/facts.md "NVIDIA device nodes": ENOENT =
node missing, EPERM = cgroup denies it, ENXIO = node with a stale major), calls cuInit(0)
through ctypes libcuda.so.1 (999 unknown = uvm denied, 100 no device, 803 driver/library
mismatch), counts devices through NVML, and compares the kernel module's version
(/proc/driver/nvidia/version) with the userspace library's. `decide()` (control side) maps
each cause to its repair.
"""

import ctypes
import errno
import json
import os
import re
import sys

NODES = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
CU_NAMES = {
    0: "CUDA_SUCCESS",
    100: "CUDA_ERROR_NO_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
}
_VER = re.compile(r"\b(\d{3}\.\d+(?:\.\d+)?)\b")


NOTDEV = -1  # the path is a regular file, not a device node


def _errname(code):
    if code == NOTDEV:
        return "NOTDEV"
    return errno.errorcode.get(code, str(code)) if code else None


def _not_a_device(path):
    """An `optional,create=file` mount whose host source was missing at start leaves an empty
    regular file at the target (seen in a real container: tests/fixtures/lxc/corpus/matrix/
    uvm_missing_optional.json): open() works, CUDA does not."""
    import stat

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def kernel_version(text):
    for line in text.splitlines():
        if line.startswith("NVRM"):
            m = _VER.search(line)
            return m.group(1) if m else None
    return None


def lib_version(real_path):
    m = re.search(r"libcuda\.so\.(\d{3}\.\d+(?:\.\d+)?)$", real_path or "")
    return m.group(1) if m else None


# -- the real box ----------------------------------------------------------------------------------


def real_open(path):
    if _not_a_device(path):
        return NOTDEV
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        return exc.errno
    os.close(fd)
    return 0


def real_cuda():
    out = {"cuinit": None, "cuinit_name": None, "libcuda": None, "cuda_error": None}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["cuda_error"] = "libcuda.so.1 not found: %s" % exc
        return out
    rc = lib.cuInit(0)
    name = ctypes.c_char_p()
    try:
        lib.cuGetErrorName(rc, ctypes.byref(name))
        out["cuinit_name"] = name.value.decode() if name.value else CU_NAMES.get(rc)
    except AttributeError:
        out["cuinit_name"] = CU_NAMES.get(rc)
    out["cuinit"] = rc
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcuda.so" in line:
                out["libcuda"] = os.path.realpath(line.split()[-1])
                break
    return out


def real_nvml():
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return {"count": None, "error": "libnvidia-ml.so.1 not found"}
    rc = lib.nvmlInit_v2()
    if rc != 0:
        return {"count": None, "error": "nvmlInit_v2 returned %d" % rc}
    n = ctypes.c_uint()
    rc = lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
    lib.nvmlShutdown()
    return {
        "count": n.value if rc == 0 else None,
        "error": None if rc == 0 else "nvmlDeviceGetCount_v2 returned %d" % rc,
    }


def run(io=None):
    """The probe's answer. `io` = (open, cuda, nvml, version file) replaces the real box's reads;
    only gpubox's simulated box passes one (its container's python3, gpubox/simbox/cuda.py): this
    file, what is shipped to a real container, holds no simulation."""
    if io:
        open_, cuda, nvml, version_file = io
    else:
        open_, version_file = real_open, "/proc/driver/nvidia/version"
        cuda, nvml = (lambda opened: real_cuda()), (lambda opened: real_nvml())
    paths = list(NODES) + [p for p in sys.argv[1:] if p not in NODES]
    opened = {p: open_(p) for p in paths}
    out = {"simulated": bool(io), "nodes": {p: _errname(e) or "ok" for p, e in opened.items()}}
    out.update(cuda(opened))
    out["nvml"] = nvml(opened)
    try:
        out["kernel_driver"] = kernel_version(open(version_file).read())
    except OSError:
        out["kernel_driver"] = None
    out["user_driver"] = lib_version(out.get("libcuda"))
    return out


# -- control side (runs in gpubox, not in the container) --------------------------------------------


def probe(container, nodes=(), timeout=60):
    """Run this module in the container (extra node paths as arguments); the JSON, or {'error': ...}."""
    from gpubox.transport import payload  # control side only: not shipped with the probe

    r = payload.run(container, "gpubox.provision.cuda_probe", nodes, timeout=timeout)
    if r.rc != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        return {"error": "probe exited %d: %s" % (r.rc, tail[0])}
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": "probe printed no JSON: %r" % r.stdout[-200:]}


def decide(res, box="BOX"):
    """[(code, cause, repair)] for everything the probe found wrong; [] when CUDA works."""
    fix = "gpubox lxc fix %s" % box
    out = []
    if res.get("error"):
        return [("probe-failed", res["error"], "check that python3 runs in the container")]
    if "kernel_driver" in res and res["kernel_driver"] is None and res.get("cuinit") != 0:
        # No /proc/driver/nvidia/version: the host has no NVIDIA module loaded. The node errors
        # follow from that (listed after it); the container config is not the cause, and CUDA's
        # return code says nothing more.
        out.append(
            (
                "host-driver",
                "the NVIDIA kernel module is not loaded on the host (no /proc/driver/nvidia/version)",
                "repair the host first: gpubox doctor %s --only devices names why (kernel/DKMS)" % box,
            )
        )
    for path, state in res.get("nodes", {}).items():
        if state == "ENOENT":
            out.append(
                (
                    "ENOENT",
                    "%s is missing in the container (absent on the host, or no mount entry/devN)" % path,
                    "%s (host: nvidia-modprobe -u -c0; conf: mount entry; then restart)" % fix,
                )
            )
        elif state == "EPERM":
            out.append(
                (
                    "EPERM",
                    "the container's device cgroup denies %s (rule missing or for a stale major)" % path,
                    "%s (rewrites lxc.cgroup2.devices.allow, live-applies it with lxc-cgroup)" % fix,
                )
            )
        elif state == "NOTDEV":
            out.append(
                (
                    "not-a-device",
                    "%s in the container is an empty regular file, not a device node: the host node "
                    "was missing when the container started" % path,
                    "restart it after host-devices: %s --restart always --yes" % fix,
                )
            )
        elif state == "ENXIO":
            out.append(
                (
                    "ENXIO",
                    "%s in the container carries a stale major (bound before the module reload)" % path,
                    "%s --restart always --yes (a restart re-binds the host's current node)" % fix,
                )
            )
        elif state != "ok":
            out.append((state, "opening %s fails with %s" % (path, state), fix))
    host_down = bool(out) and out[0][0] == "host-driver"
    rc = None if host_down else res.get("cuinit")
    kv, uv = res.get("kernel_driver"), res.get("user_driver")
    if rc is None and res.get("cuda_error"):
        out.append(
            (
                "no-libcuda",
                "libcuda.so.1 is not installed in the container",
                "install the userspace driver %s without its kernel module (e.g. the .run with --no-kernel-module)"
                % (kv or ""),
            )
        )
    elif rc == 999:
        out.append(
            (
                "cuInit-999",
                "cuInit(0) = 999 CUDA_ERROR_UNKNOWN: nvidia-uvm is not usable in the container",
                fix,
            )
        )
    elif rc == 100:
        out.append(
            ("cuInit-100", "cuInit(0) = 100 CUDA_ERROR_NO_DEVICE: no GPU node usable in the container", fix)
        )
    elif rc == 803 or (kv and uv and kv != uv):
        out.append(
            (
                "cuInit-803",
                "driver/library mismatch: host kernel module %s, container libcuda %s" % (kv, uv),
                "install userspace driver %s in the container (no kernel module: the .run with "
                "--no-kernel-module); where apt installed it, hold it (apt-mark hold libnvidia-compute-<branch> "
                "...) so an unattended upgrade cannot move it past the host's module again" % kv,
            )
        )
    elif rc == 802:
        out.append(
            (
                "cuInit-802",
                "cuInit(0) = 802 CUDA_ERROR_SYSTEM_NOT_READY: the NVSwitch fabric is not set up "
                "(nvidia-fabricmanager not running on the host, or not the driver's version)",
                "on the host: systemctl status nvidia-fabricmanager; install the fabric manager of "
                "exactly the driver's version (nvidia-smi: Driver Version) and restart it",
            )
        )
    elif rc not in (0, None):
        out.append(("cuInit-%s" % rc, "cuInit(0) = %s %s" % (rc, res.get("cuinit_name")), fix))
    return out


if __name__ == "__main__":
    json.dump(run(), sys.stdout)
    sys.stdout.write("\n")
