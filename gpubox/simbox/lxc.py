"""Simulated Proxmox side of the GPU container: /proc/devices, /dev/nvidia* nodes, 200.conf, the
container's running state, live cgroup rules and /dev, and the stand-ins `pct`,
`nvidia-modprobe`, `lxc-cgroup`.

Device nodes are real character devices made with os.mknod under the host/container roots (we
run as root here and in CI); only their major:minor matters, nothing ever opens them. Without
CAP_MKNOD the build fails with a clear message rather than faking nodes with regular files,
because gpubox's checks read st_rdev and a fake would make them lie.
"""

from __future__ import annotations

import os

from .core import SimBox
from .devnodes import mknod  # noqa: F401  (tests and the stand-ins make nodes with it)

FAULTS = {
    "uvm_stale_major": "the container config allows nvidia-uvm major 508; /proc/devices now says 511",
    "uvm_missing": "nvidia-uvm is not loaded after boot: no /dev/nvidia-uvm{,-tools} on the host",
    "container_stopped": "the GPU container is stopped",
    "conf_pending": "the container config has a [pve:pending] section (pending memory/swap change)",
    "conf_locked": "the container config carries `lock: backup` (a backup is running)",
    "conf_v1": "the container config uses cgroup v1 `lxc.cgroup.devices.allow` lines (ignored on cgroup v2)",
    "pve_no_quorum": "the node has no quorum: /etc/pve (pmxcfs) is read-only, every write fails with EACCES",
    "conf_devn_collision": "someone added `dev0: /dev/nvidia0` while a mount entry passes it too: the next start "
    "fails (autodev hook: File exists)",
}

UVM_MAJOR, STALE_UVM_MAJOR = 511, 508
CAPS_MAJOR = 235
# Character devices of a Proxmox VE 9 host (kernel 6.14) with the NVIDIA open driver 580. The
# dynamic range 254..234 is used up by other drivers and nvidia.ko's own regions, so nvidia-uvm,
# loaded last, gets 511 (docs/facts.md "Dynamic majors").
PROC_DEVICES_CHAR = [
    (1, "mem"),
    (4, "/dev/vc/0"),
    (4, "tty"),
    (4, "ttyS"),
    (5, "/dev/tty"),
    (5, "/dev/console"),
    (5, "/dev/ptmx"),
    (7, "vcs"),
    (10, "misc"),
    (13, "input"),
    (21, "sg"),
    (29, "fb"),
    (89, "i2c"),
    (108, "ppp"),
    (128, "ptm"),
    (136, "pts"),
    (180, "usb"),
    (189, "usb_device"),
    (195, "nvidia"),
    (195, "nvidiactl"),
    (202, "cpu/msr"),
    (203, "cpu/cpuid"),
    (226, "drm"),
    (234, "nvidia-caps-imex-channels"),
    (235, "nvidia-caps"),
    (236, "nvidia-nvlink"),
    (237, "nvidia-nvswitch"),
    (238, "aux"),
    (239, "cec"),
    (240, "lirc"),
    (241, "ipmidev"),
    (242, "hidraw"),
    (243, "ttyDBC"),
    (244, "wwan_port"),
    (245, "nvme-generic"),
    (246, "nvme"),
    (247, "bsg"),
    (248, "watchdog"),
    (249, "ptp"),
    (250, "pps"),
    (251, "rtc"),
    (252, "dma_heap"),
    (253, "tpm"),
    (254, "gpiochip"),
    (UVM_MAJOR, "nvidia-uvm"),
]
PROC_DEVICES_BLOCK = [
    (7, "loop"),
    (8, "sd"),
    (9, "md"),
    (65, "sd"),
    (253, "device-mapper"),
    (254, "mdp"),
    (259, "blkext"),
]
GPU_BDFS = [
    "0000:17:00.0",
    "0000:3d:00.0",
    "0000:63:00.0",
    "0000:89:00.0",
    "0000:97:00.0",
    "0000:bd:00.0",
    "0000:e3:00.0",
    "0000:e9:00.0",
    # boxes of more than 8 GPUs continue on the buses gpubox.simbox.pci.BUSES lists
    "0000:18:00.0",
    "0000:3e:00.0",
    "0000:64:00.0",
    "0000:8a:00.0",
    "0000:98:00.0",
    "0000:be:00.0",
    "0000:e4:00.0",
    "0000:ea:00.0",
]


def proc_devices(char: list[tuple[int, str]]) -> str:
    out = ["Character devices:"] + [f"{m:3d} {n}" for m, n in sorted(char, key=lambda x: x[0])]
    out += ["", "Block devices:"] + [f"{m:3d} {n}" for m, n in PROC_DEVICES_BLOCK]
    return "\n".join(out) + "\n"


def conf_text(sim: SimBox, faults: set[str]) -> str:
    uvm = STALE_UVM_MAJOR if "uvm_stale_major" in faults else UVM_MAJOR
    key = "lxc.cgroup.devices.allow" if "conf_v1" in faults else "lxc.cgroup2.devices.allow"
    main = [
        "#Qwen3.6-27B inference (DFlash + DDTree), 8x RTX PRO 6000",
        "#GPU passthrough%3A see team wiki",
        "arch: amd64",
        "cores: 96",
        "features: nesting=1",
        f"hostname: {sim.box}",
    ]
    if "conf_locked" in faults:
        main.append("lock: backup")
    main += [
        "memory: 393216",
        "mp0: /tank/models,mp=/mnt/models",
        "net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:6E:1F:2A,ip=dhcp,type=veth",
        "onboot: 1",
        "ostype: ubuntu",
        "parent: pre-driver-580",
        f"rootfs: local-zfs:subvol-{sim.vmid}-disk-0,size=300G",
        "swap: 0",
        "unprivileged: 0",
    ]
    if "conf_devn_collision" in faults:  # Proxmox writes keys sorted: dev0 after cores/arch
        main.insert(main.index("features: nesting=1"), "dev0: /dev/nvidia0,mode=0666")
    main += [
        f"{key}: c 195:* rwm",
        f"{key}: c {uvm}:* rwm",
        f"{key}: c {CAPS_MAJOR}:* rwm",
    ]
    for i in range(sim.gpus):
        main.append(f"lxc.mount.entry: /dev/nvidia{i} dev/nvidia{i} none bind,optional,create=file")
    for n in ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"):
        main.append(f"lxc.mount.entry: /dev/{n} dev/{n} none bind,optional,create=file")
    main.append("lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir")
    out = "\n".join(main) + "\n"
    if "conf_pending" in faults:
        out += "\n[pve:pending]\ndelete: swap\nmemory: 524288\n"  # write_pct_config sorts keys
    # A snapshot from before the driver upgrade, with the old major: must never be edited.
    out += (
        "\n[pre-driver-580]\narch: amd64\ncores: 96\nfeatures: nesting=1\n"
        f"hostname: {sim.box}\nmemory: 393216\n"
        "net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:6E:1F:2A,ip=dhcp,type=veth\n"
        f"ostype: ubuntu\nrootfs: local-zfs:subvol-{sim.vmid}-disk-0,size=300G\nsnaptime: 1761912000\n"
        "swap: 0\nunprivileged: 0\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
        "lxc.cgroup2.devices.allow: c 509:* rwm\n"
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n"
    )
    return out


def build(sim: SimBox, faults: set[str]) -> None:
    from . import base, pmxcfs
    from .cmds import pct

    h = sim.hpath
    char = list(PROC_DEVICES_CHAR)
    if "uvm_missing" in faults:
        char = [c for c in char if c[1] != "nvidia-uvm"]
    h("/proc/devices").parent.mkdir(parents=True, exist_ok=True)
    h("/proc/devices").write_text(proc_devices(char))
    for i in range(sim.gpus):
        mknod(h(f"/dev/nvidia{i}"), 195, i)
        (h("/proc/driver/nvidia/gpus") / GPU_BDFS[i % len(GPU_BDFS)]).mkdir(parents=True, exist_ok=True)
        (h("/proc/driver/nvidia/gpus") / GPU_BDFS[i % len(GPU_BDFS)] / "information").write_text(
            f"Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition\nBus Location: \t {GPU_BDFS[i]}\n"
        )
    mknod(h("/dev/nvidiactl"), 195, 255)
    mknod(h("/dev/nvidia-modeset"), 195, 254)
    mknod(h("/dev/nvidia-caps/nvidia-cap1"), CAPS_MAJOR, 1, 0o400)
    mknod(h("/dev/nvidia-caps/nvidia-cap2"), CAPS_MAJOR, 2, 0o444)
    if "uvm_missing" not in faults:
        mknod(h("/dev/nvidia-uvm"), UVM_MAJOR, 0)
        mknod(h("/dev/nvidia-uvm-tools"), UVM_MAJOR, 1)
    pmxcfs.build_tree(sim.host_root, sim.host)  # lxc -> nodes/<node>/lxc, as pmxcfs shows it
    conf = h(f"/etc/pve/lxc/{sim.vmid}.conf")
    # A pending change is made while the CT runs (pct start would apply it: LXC.pm vm_start), so the
    # file gets its [pve:pending] section only after the start below.
    conf.write_text(conf_text(sim, faults - {"conf_pending", "conf_devn_collision"}))
    # The container's userspace driver matches the host kernel module (same version string).
    lib = sim.cpath("/usr/lib/x86_64-linux-gnu")
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"libcuda.so.{base.DRIVER}").write_bytes(b"\x7fELF simulated libcuda\n")
    os.symlink(f"libcuda.so.{base.DRIVER}", lib / "libcuda.so.1")
    with sim.state() as st:
        st.setdefault("lxc", {})["uvm_major"] = UVM_MAJOR
        st["containers"][str(sim.vmid)] = {"status": "stopped", "cgroup_allow": [], "boots": 0}
    for name in ("pct", "nvidia-modprobe", "lxc-cgroup"):
        sim.install_standin(name)
    sim.inventory_extra["container"].setdefault("gpubox_gpus", sim.gpus)
    sim.inventory_extra["host"].setdefault("gpubox_proxmox_node", sim.host)
    if "container_stopped" not in faults:
        # It was started after the (faulty) reboot, before any backup took the lock.
        pct.start(sim, sim.vmid, record_boot=False, ignore_lock=True)
    conf.write_text(conf_text(sim, faults))
    pmxcfs.settle_tree(sim.host_root)
    if "pve_no_quorum" in faults:
        pmxcfs.set_quorate(sim, False)
