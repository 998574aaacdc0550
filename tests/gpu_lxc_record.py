"""Record `gpubox lxc check/fix` against a real LXC container on a real GPU (the device machine):
tests/fixtures/lxc/gpu/h200_real_lxc.json.

Run there as root, from a checkout of gpubox, with Debian's lxc .debs and the Python wheels gpubox
needs beside it (docs/lxc.md "The real-GPU run"):
    python3 -m tests.gpu_lxc_record DEBS_DIR OUT.json

What it does, per case (a config allowing only `c 195:*`; one with a stale uvm major):
1. Debian's lxc unpacked with `dpkg -x` into /tmp/lxcp, run with PATH/LD_LIBRARY_PATH (the only
   paths added to `/`: a /usr/share/lxc link and LXC's empty rootfs mount point);
2. a Proxmox-like host root /tmp/pve-<case>: the machine's own /proc/devices and NVIDIA driver files,
   device nodes with the machine's majors, etc/pve/lxc/200.conf; gpubox's inventory with the real-LXC
   `pct` (gpubox.simbox.lxcpct) on its PATH: each `pct exec` runs in a fresh real container whose
   rootfs is a read-only rbind of `/`, the real /dev/nvidia* bind-mounted by the config's lines;
3. `pct start 200`, `nvidia-smi -L` and a CUDA allocation inside, `gpubox lxc check`, `gpubox lxc fix
   --restart always --yes`, `gpubox lxc check` again, the allocation again.
The host's /sys/fs/cgroup is left as it is (cgroup2-only there: lxcreal uses it without remounting).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent
PREFIX = Path("/tmp/lxcp")
ALLOC = "import torch; x = torch.ones(1024, device='cuda'); print('cuda ok', float(x.sum()))"
CASES = {"only_195": "lxc.cgroup2.devices.allow: c 195:* rwm\n", "stale_uvm": None}


def sh(argv, **kw) -> dict:
    t = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=240, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {
            "argv": argv,
            "rc": 127,
            "stdout": "",
            "stderr": str(exc),
            "seconds": round(time.monotonic() - t, 2),
        }
    return {
        "argv": argv,
        "rc": r.returncode,
        "stdout": r.stdout[-6000:],
        "stderr": r.stderr[-3000:],
        "seconds": round(time.monotonic() - t, 2),
    }


def setup_lxc(debs: Path) -> dict:
    PREFIX.mkdir(exist_ok=True)
    for d in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(d), str(PREFIX)], check=True)
    if not os.path.exists("/usr/share/lxc"):
        os.symlink(PREFIX / "usr/share/lxc", "/usr/share/lxc")
    os.makedirs("/usr/lib/x86_64-linux-gnu/lxc/rootfs", exist_ok=True)
    os.environ["PATH"] = f"{PREFIX}/usr/bin:{PREFIX}/usr/sbin:" + os.environ["PATH"]
    libs = f"{PREFIX}/usr/lib/x86_64-linux-gnu:{PREFIX}/lib/x86_64-linux-gnu"
    os.environ["LD_LIBRARY_PATH"] = libs + (
        ":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else ""
    )
    return sh(["lxc-start", "--version"])


def majors(proc_devices: str) -> dict[str, int]:
    out, char = {}, False
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            char = line.startswith("Character")
        elif char and line.strip():
            n, name = line.split(None, 1)
            out.setdefault(name.strip(), int(n))
    return out


def host_root(case: str, conf_rules: str) -> tuple[Path, str]:
    root = Path(f"/tmp/pve-{case}")
    shutil.rmtree(root, ignore_errors=True)
    (root / "proc/driver").mkdir(parents=True)
    (root / "proc/devices").write_text(Path("/proc/devices").read_text())
    if os.path.isdir("/proc/driver/nvidia"):
        shutil.copytree(
            "/proc/driver/nvidia",
            root / "proc/driver/nvidia",
            dirs_exist_ok=True,
            ignore_dangling_symlinks=True,
            copy_function=_copy_text,
        )
    nodes = []
    for p in sorted(Path("/dev").glob("nvidia*")) + sorted(Path("/dev").glob("nvidia-caps/*")):
        st = os.lstat(p)
        if stat.S_ISCHR(st.st_mode):
            q = root / str(p).lstrip("/")
            q.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(q, stat.S_IFCHR | stat.S_IMODE(st.st_mode), st.st_rdev)
            nodes.append(str(p))
    text = "arch: amd64\nhostname: gpu-ct\nostype: ubuntu\nunprivileged: 0\n" + conf_rules
    for n in nodes:
        if "nvidia-caps/" not in n:
            text += f"lxc.mount.entry: {n} {n.lstrip('/')} none bind,optional,create=file\n"
    (root / "etc/pve/lxc").mkdir(parents=True)
    (root / "etc/pve/lxc/200.conf").write_text(text)
    return root, text


def _copy_text(src, dst):
    try:
        Path(dst).write_bytes(Path(src).read_bytes())
    except OSError:
        pass


def inventory(root: Path, bindir: Path) -> Path:
    import yaml

    inv = {
        "all": {
            "children": {
                "proxmox_hosts": {
                    "hosts": {
                        "pve1": {
                            "ansible_connection": "local",
                            "gpubox_root": str(root),
                            "gpubox_bin_dirs": [str(bindir)],
                        }
                    }
                },
                "gpu_containers": {
                    "hosts": {
                        "ct200": {
                            "gpubox_connection": "pct",
                            "gpubox_vmid": 200,
                            "gpubox_proxmox_host": "pve1",
                            "gpubox_gpus": 1,
                        }
                    }
                },
            }
        }
    }
    p = root / "inventory.yml"
    p.write_text(yaml.safe_dump(inv))
    return p


def pct_shim(root: Path) -> Path:
    bindir = root / "bin"
    bindir.mkdir()
    py = sys.executable
    (bindir / "pct").write_text(
        f"#!/bin/sh\nexport PYTHONPATH={os.environ.get('PYTHONPATH', '')}\n"
        f'exec {py} -m gpubox.simbox.lxcpct --root {root} pct "$@"\n'
    )
    os.chmod(bindir / "pct", 0o755)
    return bindir


def run_case(case: str, rules: str | None, proc: str) -> dict:
    m = majors(proc)
    uvm = m.get("nvidia-uvm")
    if rules is None:  # a stale uvm major: the first char major free below the real one
        used = set(m.values())
        stale = next(x for x in range(uvm - 1, 200, -1) if x not in used)
        rules = f"lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c {stale}:* rwm\n"
    root, text = host_root(case, rules)
    bindir = pct_shim(root)
    inv = inventory(root, bindir)
    pct = [str(bindir / "pct")]
    gpubox = [
        sys.executable,
        "-c",
        "import sys; from gpubox.cli import main; sys.exit(main())",
        "-i",
        str(inv),
    ]
    doc: dict = {"case": case, "config_before": text, "uvm_major": uvm}
    doc["pct_start"] = sh([*pct, "start", "200"])
    doc["nvidia_smi_before"] = sh([*pct, "exec", "200", "--", "nvidia-smi", "-L"])
    doc["alloc_before"] = sh([*pct, "exec", "200", "--", "python3", "-c", ALLOC])
    doc["check_before"] = sh([*gpubox, "lxc", "check", "ct200", "--json"])
    doc["fix"] = sh([*gpubox, "lxc", "fix", "ct200", "--restart", "always", "--yes", "--json"])
    doc["config_after"] = (root / "etc/pve/lxc/200.conf").read_text()
    doc["check_after"] = sh([*gpubox, "lxc", "check", "ct200", "--json"])
    doc["alloc_after"] = sh([*pct, "exec", "200", "--", "python3", "-c", ALLOC])
    doc["nvidia_smi_after"] = sh([*pct, "exec", "200", "--", "nvidia-smi", "-L"])
    return doc


def main(argv: list[str]) -> int:
    debs, out = Path(argv[0]), Path(argv[1])
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["PYTHONPATH"] = f"{SRC}:" + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, str(SRC))
    doc: dict = {"kernel": platform.release(), "date": time.strftime("%Y-%m-%d", time.gmtime())}
    doc["lxc_version"] = setup_lxc(debs)
    doc["cgroup_mount"] = [
        l for l in Path("/proc/self/mountinfo").read_text().splitlines() if " /sys/fs/cgroup " in l
    ]
    from gpubox.simbox import lxcreal

    doc["runtime"] = lxcreal.detect().__dict__
    doc["nvidia_smi_host"] = sh(["nvidia-smi", "-L"])
    proc = Path("/proc/devices").read_text()
    doc["proc_devices"] = proc
    doc["cases"] = []
    for case, rules in CASES.items():
        try:
            doc["cases"].append(run_case(case, rules, proc))
        except Exception as exc:  # record what blocked it, go on with the next case
            doc["cases"].append({"case": case, "error": f"{type(exc).__name__}: {exc}"})
        out.write_text(json.dumps(doc, indent=1))
    out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
