"""The real-kernel corpus: container configs started as real LXC containers, their answers recorded.

Entries (tests/fixtures/lxc/corpus/<group>/<name>.json), each: the pct config, the host it ran on
(/proc/devices, the device nodes with major:minor and mode, plain files), whether the container
started (and LXC's / pve's error lines), the verdict per node (open() errno in the container), the
machine it was recorded on and the command that re-records it. Groups:
- realworld: every config of tests/fixtures/lxc/realworld/ as written (provenance in their .source);
- fixed: the same configs after `gpubox lxc fix` (confedit.decide): they must start, every NVIDIA node rw;
- matrix: synthetic rule and mount shapes (MATRIX below), one class each.

Re-record (root, Debian's lxc, a cgroup2-capable kernel; a hybrid host is handled in a private
mount namespace): `.venv/bin/python -m tests.lxc_corpus record [NAME...]`
"""

from __future__ import annotations

import json
import os
import platform
import stat
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).parent
CORPUS = HERE / "fixtures" / "lxc" / "corpus"
REAL = HERE / "fixtures" / "lxc" / "realworld"
RECORD_CMD = ".venv/bin/python -m tests.lxc_corpus record"

# Nodes the hosts of the real configs have besides the NVIDIA ones (major:minor as on a stock kernel).
STOCK_NODES = {
    "/dev/dri/card0": (226, 0),
    "/dev/dri/renderD128": (226, 128),
    "/dev/uinput": (10, 223),
    "/dev/uhid": (10, 239),
    "/dev/net/tun": (10, 200),
    "/dev/ppp": (108, 0),
    "/dev/apex_0": (120, 0),
}
OTHER_NODES = {
    **STOCK_NODES,
    # frigate_8652_dirmounts_coral binds nodes its owner made under /lxc/102010/devices
    "/lxc/102010/devices/nvidia0": (195, 0),
    "/lxc/102010/devices/nvidia1": (195, 1),
    "/lxc/102010/devices/apex_0": (120, 0),
    "/lxc/102010/devices/apex_1": (120, 1),
}
# Plain files a GPU host has that configs bind-mount (the userspace driver).
HOST_FILES = ("/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
# openwrt_v1_v2_allow_a_ppp_tun includes OpenWrt's own LXC config, which its host had: an empty
# stand-in (no device lines) under the host root.
HOST_INCLUDES = ("/usr/share/lxc/config/openwrt.common.conf",)

P = "arch: amd64\nostype: ubuntu\nhostname: ct\n"
A = "lxc.cgroup2.devices.allow"
D = "lxc.cgroup2.devices.deny"
M = "lxc.mount.entry"
NV_MOUNTS = (
    "".join(
        f"{M}: /dev/{n} dev/{n} none bind,optional,create=file\n"
        for n in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools")
    )
    + f"{M}: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir\n"
)
GOOD = f"{A}: c 195:* rwm\n{A}: c 511:* rwm\n{A}: c 235:* rwm\n"

# name -> (host variant, config). One rule/mount class each; the comment says what it probes.
MATRIX = {
    "only_195": ("stock", P + f"{A}: c 195:* rwm\n" + NV_MOUNTS),  # uvm denied
    "stale_uvm_508": ("stock", P + f"{A}: c 195:* rwm\n{A}: c 508:* rwm\n" + NV_MOUNTS),
    "good_majors": ("stock", P + GOOD + NV_MOUNTS),
    "unpriv_stale_uvm": (
        "stock",
        P + "unprivileged: 1\n" + f"{A}: c 195:* rwm\n{A}: c 508:* rwm\n" + NV_MOUNTS,
    ),
    "unpriv_deny_uvm": ("stock", P + "unprivileged: 1\n" + f"{D}: c 511:* rwm\n" + NV_MOUNTS),
    "unpriv_deny_uvm_r": ("stock", P + "unprivileged: 1\n" + f"{D}: c 511:* r\n" + NV_MOUNTS),
    "custom_idmap": (
        "stock",
        P + f"{A}: c 195:* rwm\nlxc.idmap: u 0 100000 65536\nlxc.idmap: g 0 100000 65536\n" + NV_MOUNTS,
    ),
    "deny_a_last": ("stock", P + f"{A}: c 195:* rwm\n{D}: a\n" + NV_MOUNTS),  # empty list: no program
    "deny_a_then_195": ("stock", P + f"{D}: a\n{A}: c 195:* rwm\n" + NV_MOUNTS),
    "allow_a": ("stock", P + f"{A}: a\n" + NV_MOUNTS),
    "allow_a_deny_uvm": ("stock", P + f"{A}: a\n{D}: c 511:* rwm\n" + NV_MOUNTS),
    "allow_a_deny_uvm_w": ("stock", P + f"{A}: a\n{D}: c 511:* w\n" + NV_MOUNTS),
    "allowlist_deny_skipped": ("stock", P + GOOD + f"{D}: c 511:* rwm\n" + NV_MOUNTS),
    "two_spaces": ("stock", P + f"{A}: c 195:* rwm\n{A}: c  511:* rwm\n" + NV_MOUNTS),
    "capital_c": ("stock", P + f"{A}: c 195:* rwm\n{A}: C 511:* rwm\n" + NV_MOUNTS),
    "minor_range": ("stock", P + f"{A}: c 195:0-3 rwm\n{A}: c 511:* rwm\n" + NV_MOUNTS),
    "no_access": ("stock", P + f"{A}: c 195:* rwm\n{A}: c 511:*\n" + NV_MOUNTS),
    "comment_after": ("stock", P + f"{A}: c 195:* rwm # nvidia\n{A}: c 511:* rwm # uvm\n" + NV_MOUNTS),
    "space_third_access": ("stock", P + f"{A}: c 195:* rw # x\n{A}: c 511:* rwm\n" + NV_MOUNTS),
    "a_star_rwm": ("stock", P + f"{A}: a *:* rwm\n" + NV_MOUNTS),
    "c_star_star": ("stock", P + f"{A}: c *:* rwm\n" + NV_MOUNTS),
    "block_type_uvm": ("stock", P + f"{A}: c 195:* rwm\n{A}: b 511:* rwm\n" + NV_MOUNTS),
    "split_access": ("stock", P + f"{A}: c 195:* rwm\n{A}: c 511:* r\n{A}: c 511:* w\n" + NV_MOUNTS),
    "uvm_read_only": ("stock", P + f"{A}: c 195:* rwm\n{A}: c 511:* r\n" + NV_MOUNTS),
    "abs_path_rule": ("stock", P + f"{A}: c 195:* rwm\n{A}: /dev/nvidia-uvm rwm\n" + NV_MOUNTS),
    "abs_path_no_mode": ("stock", P + f"{A}: c 195:* rwm\n{A}: /dev/nvidia-uvm\n" + NV_MOUNTS),
    "empty_clears_allow": ("stock", P + GOOD + f"{A}:\n{A}: c 195:* rwm\n" + NV_MOUNTS),
    "v1_keys_only": (
        "stock",
        P + "lxc.cgroup.devices.allow: c 195:* rwm\nlxc.cgroup.devices.allow: c 511:* rwm\n" + NV_MOUNTS,
    ),
    "devn_nodes": (
        "stock",
        P + "dev0: /dev/nvidia0\ndev1: /dev/nvidiactl\ndev2: /dev/nvidia-uvm\ndev3: /dev/nvidia-uvm-tools\n",
    ),
    "devn_deny_write": (
        "stock",
        P + "dev0: /dev/nvidia0\ndev1: /dev/nvidiactl\ndev2: /dev/nvidia-uvm,deny-write=1\n",
    ),
    "devn_unpriv": (
        "stock",
        P + "unprivileged: 1\ndev0: /dev/nvidia0,gid=44\ndev1: /dev/nvidiactl\n"
        "dev2: /dev/nvidia-uvm,mode=0666\n",
    ),
    "devn_plus_mount": ("stock", P + "dev0: /dev/nvidia0\n" + GOOD + NV_MOUNTS),  # autodev EEXIST
    "devn_missing_device": ("uvm_missing", P + "dev0: /dev/nvidia0\ndev1: /dev/nvidia-uvm\n"),
    "uvm_missing_optional": ("uvm_missing", P + GOOD + NV_MOUNTS),  # empty regular file
    "uvm_missing_not_optional": (
        "uvm_missing",
        P + GOOD + f"{M}: /dev/nvidia-uvm dev/nvidia-uvm none bind,create=file\n",
    ),
    "plain_file_sources": (
        "stock",
        P + GOOD + NV_MOUNTS + f"{M}: /usr/bin/nvidia-smi usr/bin/nvidia-smi none bind,create=file\n"
        f"{M}: /usr/lib/x86_64-linux-gnu/libcuda.so.1 usr/lib/x86_64-linux-gnu/libcuda.so.1 "
        "none bind,create=file\n",
    ),
    "relative_source": (
        "stock",
        P + GOOD + f"{M}: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
        f"{M}: dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file\n",
    ),
    "relative_source_not_optional": (
        "stock",
        P + GOOD + f"{M}: dev/nvidia-modeset dev/nvidia-modeset none bind,create=file\n",
    ),
    "dev_dir_bind": (
        "stock",
        P + GOOD + f"{M}: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir\n",
    ),
    "unpriv_cap_mode": ("stock", P + "unprivileged: 1\n" + NV_MOUNTS),  # nvidia-cap1 is 0400 root
}


def build_host(root: Path, variant: str) -> dict:
    """A host root with fake NVIDIA nodes (tests.lxc_fakehost), the other nodes and plain files;
    returns its description (what the JSON keeps and `host_from` rebuilds)."""
    from gpubox.simbox.lxc import mknod
    from tests.lxc_fakehost import fake_host

    fake_host(root, uvm=511, uvm_nodes=variant != "uvm_missing")
    for p, (ma, mi) in OTHER_NODES.items():
        mknod(root / p.lstrip("/"), ma, mi)
    for f in HOST_FILES:
        (root / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / f.lstrip("/")).write_bytes(b"\x7fELF host userspace driver\n")
    for f in HOST_INCLUDES:
        (root / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / f.lstrip("/")).write_text("# stand-in for the host's own file (no device lines)\n")
    return describe_host(root)


def describe_host(root: Path) -> dict:
    nodes, files = {}, []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            st = os.lstat(p)
            rel = "/" + str(p.relative_to(root))
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                t = "c" if stat.S_ISCHR(st.st_mode) else "b"
                nodes[rel] = [t, os.major(st.st_rdev), os.minor(st.st_rdev), oct(stat.S_IMODE(st.st_mode))]
            elif stat.S_ISREG(st.st_mode) and not rel.startswith("/proc/"):
                files.append(rel)
    return {
        "proc_devices": (root / "proc/devices").read_text(),
        "nodes": dict(sorted(nodes.items())),
        "files": sorted(files),
    }


def host_from(desc: dict, root: Path) -> Path:
    """Rebuild a recorded host under `root` (what the model and the re-run read)."""
    from gpubox.simbox.lxc import mknod

    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/devices").write_text(desc["proc_devices"])
    for p, (t, ma, mi, mode) in desc["nodes"].items():
        assert t == "c", p
        mknod(root / p.lstrip("/"), ma, mi, int(mode, 8))
    for f in desc["files"]:
        (root / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / f.lstrip("/")).write_bytes(b"\x7fELF host userspace driver\n")
    return root


def cases() -> dict[str, tuple[str, str]]:
    """name -> (host variant, config text) for every entry of the corpus."""
    from gpubox.provision.confedit import decide
    from gpubox.provision.devices import read_host_devices
    from gpubox.provision.lxcconf import LxcConf
    from gpubox.provision.lxcmodel import host_rdev_under
    from tests.lxc_fakehost import fake_host

    out = {f"matrix/{k}": v for k, v in MATRIX.items()}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "pve1"
        build_host(root, "stock")
        h = fake_host(root)  # same layout, a Host to read it through
        hd = read_host_devices(h, 2)
        for c in sorted(REAL.glob("*.conf")):
            raw = c.read_bytes().decode()
            out[f"realworld/{c.stem}"] = ("stock", raw)
            rev = decide(LxcConf.parse(raw), hd, None, host_rdev_under(str(root)))
            out[f"fixed/{c.stem}"] = ("stock", rev.new)
    return out


def record(names: list[str] | None = None) -> list[Path]:
    """Start every (or the named) entry as a real container and write its JSON."""
    from gpubox.simbox import lxcreal

    rt = lxcreal.detect()
    if not rt.real:
        raise SystemExit(f"cannot record: no real LXC here ({rt.reason})")
    todo = {k: v for k, v in cases().items() if not names or k in names or k.split("/", 1)[1] in names}
    written = []
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        hosts, specs, keys = {}, [], []
        for name, (variant, text) in todo.items():
            if variant not in hosts:
                root = Path(d) / variant
                hosts[variant] = (root, build_host(root, variant))
            specs.append(lxcreal.Spec(text, str(hosts[variant][0])))
            keys.append(name)
        answers = lxcreal.run(specs, rt)
        for name, ans in zip(keys, answers):
            variant = todo[name][0]
            entry = {
                "name": name,
                "config": todo[name][1],
                "host_variant": variant,
                "host": hosts[variant][1],
                "real": {
                    "starts": ans["starts"],
                    "error": [_unroot(e, d) for e in ans["error"]],
                    "nodes": {p: n["verdict"] for p, n in ans["nodes"].items()},
                    "errno": {p: [n["errno_rw"], n["errno_ro"]] for p, n in ans["nodes"].items()},
                    "cuinit_standin": ans["cuinit"],
                    "dropped": ans["dropped"],
                },
                "recorded": {
                    "runtime": ans["runtime"],
                    "kernel": platform.release(),
                    "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                    "command": f"{RECORD_CMD} {name}",
                },
            }
            out = CORPUS / f"{name}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(entry, indent=1, sort_keys=False) + "\n")
            written.append(out)
    return written


def _unroot(line: str, tmp: str) -> str:
    """Error lines without the recording's temp paths (host root, lxcpath)."""
    import re

    line = re.sub(r"/tmp/gpubox-lxc-\d+-[^/ ]+/gpubox-\d+-\d+", "<ct>", line)
    line = re.sub(r"gpubox-\d+-\d+", "<ct>", line)
    return line.replace(tmp + "/stock", "<host>").replace(tmp + "/uvm_missing", "<host>")


def load() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(CORPUS.rglob("*.json"))]


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "record":
        for p in record(sys.argv[2:] or None):
            print(p.relative_to(HERE.parent))
        sys.exit(0)
    print(__doc__)
    sys.exit(2)
