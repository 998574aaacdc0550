"""`gpubox lxc check/fix` against the simulated box: the issue's Done-when and each fault."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from gpubox.simbox import SimBox, build
from gpubox.simbox.cmds import pct
from gpubox.simbox.core import StandinError
from tests.clirun import gpubox


def _box(tmp_path, *faults, gpus=2, **inv_extra):
    sim = build(tmp_path / "box", faults, gpus=gpus)
    if inv_extra:
        inv = yaml.safe_load(sim.inventory_path.read_text())
        inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"].update(inv_extra)
        sim.inventory_path.write_text(yaml.safe_dump(inv))
    return sim


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # table cells unwrapped, so phrases can be matched


def _lxc(capsys, sim, *args):
    return gpubox(capsys, "-i", sim.inventory_path, "lxc", *args)


def _json(capsys, sim, *args):
    rc, out, err = _lxc(capsys, sim, *args, "--json")
    return rc, json.loads(out)


def _steps(doc):
    return {s["name"]: s for s in doc["steps"]}


def _conf(sim):
    return sim.hpath("/etc/pve/lxc/200.conf").read_bytes()


def _boots(sim):
    return sim.read_state()["containers"]["200"]["boots"]


def test_done_when_stale_major_and_missing_uvm(tmp_path, capsys):
    sim = _box(tmp_path, "uvm_stale_major", "uvm_missing")
    rc, out, err = _lxc(capsys, sim, "check", "ct200")
    assert rc == 1
    assert "nvidia-uvm is not loaded" in out and "/dev/nvidia-uvm missing" in out  # cause 1: host nodes
    assert "508" in out and "stale" in out  # cause 2: stale major in the cgroup rule
    snapshot_before = _conf(sim).split(b"\n[pre-driver-580]")[1]

    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 0 and doc["ok"] and doc["changed"]
    st = _steps(doc)
    # with -u, -c N is a uvm base minor (nvidia-modprobe.c), so uvm takes exactly `-u -c0`
    assert st["host-devices"]["commands"] == [["nvidia-modprobe", "-u", "-c0"]]
    assert (
        "-lxc.cgroup2.devices.allow: c 508:* rwm\n+lxc.cgroup2.devices.allow: c 511:* rwm"
        in st["container-config"]["diff"]
    )
    assert st["container"]["commands"] == [["pct", "reboot", "200"]] and st["cuda"]["status"] == "ok"
    assert _conf(sim).split(b"\n[pre-driver-580]")[1] == snapshot_before  # snapshot untouched
    assert os.stat(sim.hpath("/dev/nvidia-uvm")).st_rdev == os.makedev(511, 0)
    assert os.stat(sim.hpath("/dev/nvidia-uvm-tools")).st_rdev == os.makedev(511, 1)

    rc, out, err = _lxc(capsys, sim, "check", "ct200")
    assert rc == 0, out
    conf_after, calls_after = _conf(sim), len(sim.calls())
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 0 and doc["changed"] is False
    assert all(s["status"] == "ok" for s in doc["steps"])
    assert _conf(sim) == conf_after
    assert not [
        c
        for c in sim.calls()[calls_after:]
        if c["argv"][:1] in (["start"], ["reboot"], ["stop"]) or c["cmd"] in ("nvidia-modprobe", "lxc-cgroup")
    ]


def test_healthy_box_passes_every_check(tmp_path, capsys):
    sim = _box(tmp_path)
    rc, doc = _json(capsys, sim, "check", "ct200")
    assert rc == 0 and [s["status"] for s in doc["steps"]] == ["ok"] * 4


def test_stale_major_alone_is_live_applied_without_restart(tmp_path, capsys):
    sim = _box(tmp_path, "uvm_stale_major")
    rc, doc = _json(capsys, sim, "check", "ct200")
    assert rc == 1
    assert _steps(doc)["container"]["evidence"]["nodes"]["/dev/nvidia-uvm"] == "EPERM"
    assert _steps(doc)["cuda"]["evidence"]["cuinit"] == 999
    rc, doc = _json(capsys, sim, "fix", "ct200", "--restart", "never")
    assert rc == 0, doc
    assert _steps(doc)["container"]["commands"] == [
        ["lxc-cgroup", "-n", "200", "devices.allow", "c 511:* rwm"]
    ]
    assert _boots(sim) == 0 and "c 511:* rwm" in sim.read_state()["containers"]["200"]["cgroup_allow"]


def test_restart_needed_but_refused(tmp_path, capsys):
    sim = _box(tmp_path, "uvm_missing")
    rc, doc = _json(capsys, sim, "fix", "ct200", "--restart", "never")
    assert rc == 1
    assert "--restart never" in _steps(doc)["container"]["detail"] and _boots(sim) == 0
    assert _steps(doc)["host-devices"]["status"] == "fixed"
    sim2 = _box(tmp_path / "2", "uvm_missing")
    rc, doc = _json(capsys, sim2, "fix", "ct200")  # auto, no --yes, no terminal: no restart
    assert rc == 1 and "without consent" in _steps(doc)["container"]["detail"] and _boots(sim2) == 0


def test_dry_run_changes_nothing_and_shows_diff_and_argv(tmp_path, capsys):
    sim = _box(tmp_path, "uvm_stale_major", "uvm_missing")
    before = _conf(sim)
    rc, out, err = _lxc(capsys, sim, "fix", "ct200", "--dry-run", "--persist")
    assert rc == 1
    assert "$ nvidia-modprobe -u -c0\n" in out and "+nvidia-uvm" in out and "70-nvidia-uvm.rules" in out
    assert "-lxc.cgroup2.devices.allow: c 508:* rwm" in out
    assert _conf(sim) == before and not sim.hpath("/dev/nvidia-uvm").exists()
    assert not sim.hpath("/etc/modules-load.d/nvidia-uvm.conf").exists()
    assert not [
        c
        for c in sim.calls()
        if c["cmd"] in ("nvidia-modprobe", "lxc-cgroup") or c["argv"][:1] in (["start"], ["reboot"])
    ]


def test_stopped_container_is_started(tmp_path, capsys):
    sim = _box(tmp_path, "container_stopped")
    rc, doc = _json(capsys, sim, "check", "ct200")
    assert rc == 1 and _steps(doc)["container"]["status"] == "drift"
    rc, doc = _json(capsys, sim, "fix", "ct200")
    assert rc == 0 and _steps(doc)["container"]["commands"] == [["pct", "start", "200"]]
    assert sim.read_state()["containers"]["200"]["status"] == "running"


def test_locked_config_is_not_touched(tmp_path, capsys):
    sim = _box(tmp_path, "conf_locked", "uvm_stale_major")
    before = _conf(sim)
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 1
    st = _steps(doc)
    assert (
        st["container-config"]["status"] == "failed" and "locked (backup)" in st["container-config"]["detail"]
    )
    assert st["container"]["status"] == "skipped"
    assert _conf(sim) == before and _boots(sim) == 0


def test_pending_section_survives_and_is_named(tmp_path, capsys):
    sim = _box(tmp_path, "conf_pending", "uvm_missing")
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 0
    # the restart applied the pending change, as `pct reboot` does (LXC.pm vm_start ->
    # vmconfig_apply_pending + write_config, which re-renders the file); snapshot kept
    assert "pending" in _steps(doc)["container"]["detail"]
    conf = _conf(sim).decode()
    assert "[pve:pending]" not in conf and "memory: 524288\n" in conf.split("\n[")[0]
    assert "\nswap:" not in conf.split("\n[")[0] and "\n[pre-driver-580]\n" in conf


def test_cgroup_v1_lines_are_converted(tmp_path, capsys):
    sim = _box(tmp_path, "conf_v1")
    rc, doc = _json(capsys, sim, "check", "ct200")
    assert rc == 1 and "cgroup v1" in _steps(doc)["container-config"]["detail"]
    assert _steps(doc)["cuda"]["evidence"]["cuinit"] == 100  # nvidiactl denied too
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 0 and b"lxc.cgroup.devices" not in _conf(sim).split(b"\n[")[0]


def test_persist_writes_boot_files_once(tmp_path, capsys):
    sim = _box(tmp_path, "uvm_missing")
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes", "--persist")
    assert rc == 0
    assert sim.hpath("/etc/modules-load.d/nvidia-uvm.conf").read_text().endswith("nvidia-uvm\n")
    rule = sim.hpath("/etc/udev/rules.d/70-nvidia-uvm.rules").read_text()
    assert 'KERNEL=="nvidia_uvm", RUN+="/usr/bin/nvidia-modprobe -u -c0"\n' in rule
    assert 'KERNEL=="nvidia", RUN+="/usr/bin/nvidia-modprobe -c0 -c1 -c255"\n' in rule
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes", "--persist")
    assert rc == 0 and doc["changed"] is False


def test_devn_mode_rewrites_to_devn_and_starts(tmp_path, capsys):
    sim = _box(tmp_path, "uvm_stale_major", gpubox_device_mode="devN")
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 0, doc
    main = _conf(sim).decode().split("\n[")[0]
    assert "dev3: /dev/nvidia-uvm,mode=0666\n" in main and "c 508:" not in main
    # the rules left are those of the optional mounts kept below (modeset 195:254, caps 235)
    assert [l for l in main.splitlines() if l.startswith("lxc.cgroup2")] == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 235:* rwm",
    ]
    # the optional nodes no boot creates keep their `optional` mounts: a devN entry would stop the start
    # on a boot without them (issue 38)
    assert [l.split()[1] for l in main.splitlines() if l.startswith("lxc.mount.entry: /dev/nvidia")] == [
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps",
    ]
    assert _boots(sim) == 0  # the running container only needed the live rule
    pct.main(SimBox.load(sim.dest), ["reboot", "200"])  # the next start uses the devN entries
    # update_lxc_config: `c MAJ:MIN rw` from the host node's st_rdev at this start
    assert "c 511:0 rw" in sim.read_state()["containers"]["200"]["cgroup_allow"]
    # gpubox writes mode=0666 (devN nodes are 0660 root:root by default: LXC.pm
    # create_passthrough_device_node); the caps nodes come through their directory mount, as on the host
    assert oct(os.stat(sim.cpath("/dev/nvidia-uvm")).st_mode & 0o777) == "0o666"
    assert oct(os.stat(sim.cpath("/dev/nvidia-caps/nvidia-cap1")).st_mode & 0o777) == "0o400"
    rc, doc = _json(capsys, sim, "check", "ct200")
    assert rc == 0


def _bin(sim, prog, *args):
    """Run a stand-in the way gpubox does: the real executable on the sim's bin/, argv, exit status."""
    import subprocess

    env = dict(os.environ, GPUBOX_SIM=str(sim.dest), GPUBOX_SIM_SIDE="host")
    return subprocess.run([str(sim.bin_dir / prog), *map(str, args)], capture_output=True, text=True, env=env)


def test_pct_standin_fails_like_pct(tmp_path):
    # Texts and exit codes checked against proxmox/pve-container 94f5585 (CLI/pct.pm,
    # API2/LXC/Status.pm, LXC.pm, LXC/Tools.pm) and pve-common f665029 (RESTEnvironment.pm).
    sim = _box(tmp_path, "container_stopped")
    r = _bin(sim, "pct", "status", "200")
    assert (r.returncode, r.stdout) == (0, "status: stopped\n")
    r = _bin(sim, "pct", "exec", "200", "--", "true")
    assert (r.returncode, r.stderr) == (255, "container '200' not running!\n")
    r = _bin(sim, "pct", "stop", "200")
    assert (r.returncode, r.stderr) == (255, "CT 200 not running\n")
    r = _bin(sim, "pct", "reboot", "200")
    assert (r.returncode, r.stderr) == (255, "VM 200 not running\n")  # sic: Status.pm vm_reboot
    r = _bin(sim, "pct", "push", "200", "/etc/hostname", "/tmp/x")
    assert (r.returncode, r.stderr) == (255, "can only push files to a running CT\n")
    r = _bin(sim, "pct", "status", "999")
    assert r.returncode == 255 and r.stderr == "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n"

    conf = sim.hpath("/etc/pve/lxc/200.conf")
    conf.write_text("arch: amd64\nhostname: ct200\nlock: backup\n")
    r = _bin(sim, "pct", "start", "200")  # the lock is checked inside the task
    assert (r.returncode, r.stderr) == (255, "CT is locked (backup)\n")
    conf.write_text("arch: amd64\ndev0: /dev/nvidia-uvm,mode=0666\nhostname: ct200\n")
    sim.hpath("/dev/nvidia-uvm").unlink()  # nvidia-uvm not loaded after boot
    r = _bin(sim, "pct", "start", "200")
    assert (r.returncode, r.stderr) == (255, "Device /dev/nvidia-uvm does not exist\n")
    with pytest.raises(StandinError, match="^Device /dev/nvidia-uvm does not exist$") as ei:
        pct.start(SimBox.load(sim.dest), 200)
    assert ei.value.rc == 255

    r = _bin(sim, "nvidia-modprobe", "-u", "-c0")
    assert r.returncode == 0 and os.stat(sim.hpath("/dev/nvidia-uvm")).st_rdev == os.makedev(511, 0)
    r = _bin(sim, "pct", "start", "200")
    allow = sim.read_state()["containers"]["200"]["cgroup_allow"]
    # common.conf's allowlist (the container's own /dev/null etc.), then what pve adds for dev0
    assert r.returncode == 0 and allow[-1] == "c 511:0 rw" and "c 1:3 rwm" in allow
    assert oct(os.stat(sim.cpath("/dev/nvidia-uvm")).st_mode & 0o777) == "0o666"  # mode= of dev0
    r = _bin(sim, "pct", "start", "200")
    assert (r.returncode, r.stderr) == (255, "CT 200 already running\n")

    src = tmp_path / "payload"
    src.write_text("hello\n")
    r = _bin(sim, "pct", "push", "200", src, "/etc/payload", "--perms", "640", "--user", "0")
    assert r.returncode == 0  # "640" is octal: pct.pm prefixes a 0, then strtoul base 0
    assert oct(os.stat(sim.cpath("/etc/payload")).st_mode & 0o777) == "0o640"
    r = _bin(sim, "pct", "push", "200", src, "/no/such/dir/f")
    assert r.returncode == 0 and r.stderr.startswith("failed to create file: ")  # no $upid_exit for push
    r = _bin(sim, "pct", "exec", "200", "--")
    assert r.returncode == 255 and r.stderr.startswith("missing command at ")


def test_pct_config_and_rewrites_are_proxmox_shaped(tmp_path):
    sim = _box(tmp_path, "conf_pending", "container_stopped")
    r = _bin(sim, "pct", "config", "200")
    lines = r.stdout.splitlines()
    keys = [l.split(":", 1)[0] for l in lines if not l.startswith("lxc.")]
    assert keys == sorted(keys) and lines[-1].startswith("lxc.mount.entry: ")  # sorted keys, lxc pairs last
    assert "memory: 524288" in lines and not any(l.startswith("swap:") for l in lines)  # pending taken in
    assert lines[keys.index("description")].startswith("description: Qwen3.6-27B") and "%3A" in r.stdout
    r = _bin(sim, "pct", "config", "200", "--current", "1")
    assert "memory: 393216" in r.stdout.splitlines()
    r = _bin(sim, "pct", "start", "200")  # vm_start applies the pending section and rewrites the file
    assert r.returncode == 0
    text = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    assert "[pve:pending]" not in text and "\nmemory: 524288\n" in text and "\n[pre-driver-580]\n" in text
    assert text.startswith("#Qwen3.6-27B") and "#GPU passthrough%3A see team wiki\n" in text


def test_pct_status_warnings_do_not_confuse_gpubox(tmp_path):
    from gpubox.host import Host
    from gpubox.inventory import HostEntry
    from gpubox.provision.pve import PctControl
    from gpubox.transport.local import LocalTransport

    sim = _box(tmp_path, "conf_v1")
    r = _bin(sim, "pct", "status", "200")
    assert r.stdout == "status: running\n"
    assert "lxc.cgroup.devices.allow is deprecated, this will be a hard error in the future!" in r.stderr
    inv = yaml.safe_load(sim.inventory_path.read_text())["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
    host = Host(HostEntry("pve1", inv), LocalTransport("pve1"))
    assert PctControl(host, 200).status() == {"status": "running", "lock": None}


def test_nvidia_modprobe_and_lxc_cgroup_standins_follow_their_sources(tmp_path):
    sim = _box(tmp_path, "uvm_missing")
    # nvidia-modprobe.c: with -u every -c N is a uvm base minor -> the last one wins
    r = _bin(sim, "nvidia-modprobe", "-u", "-c0", "-c1")
    assert r.returncode == 0 and os.stat(sim.hpath("/dev/nvidia-uvm")).st_rdev == os.makedev(511, 1)
    assert os.stat(sim.hpath("/dev/nvidia-uvm-tools")).st_rdev == os.makedev(511, 2)
    sim.hpath("/dev/nvidiactl").unlink()
    r = _bin(sim, "nvidia-modprobe", "-c0", "-c255")
    assert r.returncode == 0 and os.stat(sim.hpath("/dev/nvidiactl")).st_rdev == os.makedev(195, 255)
    r = _bin(sim, "nvidia-modprobe", "-x")
    assert r.returncode == 1 and r.stderr.startswith('nvidia-modprobe: unrecognized option: "-x"')
    # lxc_cgroup.c + log.c stderr format; exit 1
    r = _bin(sim, "lxc-cgroup", "-n", "200", "devices.list")  # no such file on cgroup v2
    assert (
        r.returncode == 1 and "Failed to retrieve value of 'devices.list' for '/var/lib/lxc:200'" in r.stderr
    )
    pct.stop(SimBox.load(sim.dest), 200)
    r = _bin(sim, "lxc-cgroup", "-n", "200", "devices.allow", "c 511:* rw")
    assert r.returncode == 1
    assert r.stderr == (
        "lxc-cgroup: 200: ../src/lxc/tools/lxc_cgroup.c: lxc_cgroup_main: 103 "
        "'/var/lib/lxc:200' is not running\n"
    )


def test_unknown_device_mode_is_bad_input(tmp_path, capsys):
    sim = _box(tmp_path, gpubox_device_mode="cdi")
    before = _conf(sim)
    rc, out, err = _lxc(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 2 and "gpubox_device_mode 'cdi'" in err and "cgroup2 or devN" in err
    assert _conf(sim) == before


def _edit_main(sim, extra: str):
    p = sim.hpath("/etc/pve/lxc/200.conf")
    text = p.read_text()
    main, sep, rest = text.partition("\n[")
    p.write_text(main.rstrip("\n") + "\n" + extra + "\n" + sep + rest if sep else text + extra + "\n")


def test_sim_start_refuses_devn_plus_mount_like_the_autodev_hook(tmp_path, capsys):
    sim = _box(tmp_path, "container_stopped")
    _edit_main(sim, "dev0: /dev/nvidia0,mode=0666")
    with pytest.raises(StandinError, match=r"Could not mknod .*/dev/nvidia0: File exists") as ei:
        pct.start(SimBox.load(sim.dest), 200)
    assert "startup for container '200' failed" in str(ei.value)
    # gpubox fix: the NVIDIA mount entry for that node goes (devN stays), the container starts
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    conf = _conf(sim).decode()
    assert "dev0: /dev/nvidia0,mode=0666" in conf
    assert "lxc.mount.entry: /dev/nvidia0 dev/nvidia0" not in conf.split("\n[")[0]
    assert rc == 0, doc
    rc2, doc2 = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc2 == 0 and _conf(sim).decode() == conf


def test_sim_start_skips_rule_lxc_cannot_parse_and_fix_leaves_foreign_one(tmp_path, capsys):
    """The real kernel (tests/fixtures/lxc/corpus/matrix/two_spaces.json): lxc logs "Failed to parse
    device rule" and skips the rule; the container starts. gpubox leaves a foreign one as it is."""
    sim = _box(tmp_path, "container_stopped")
    _edit_main(sim, "lxc.cgroup2.devices.allow: c  120:0 rwm")
    pct.start(SimBox.load(sim.dest), 200)
    assert pct.is_running(SimBox.load(sim.dest), 200)
    pct.stop(SimBox.load(sim.dest), 200)
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert b"lxc.cgroup2.devices.allow: c  120:0 rwm\n" in _conf(sim)
    assert "cannot parse" in json.dumps(doc) and "skips it" in json.dumps(doc)


def test_rule_with_inline_comment_counts_in_config_and_in_the_started_container(tmp_path, capsys):
    sim = _box(tmp_path, "container_stopped")
    p = sim.hpath("/etc/pve/lxc/200.conf")
    main, sep, rest = p.read_text().partition("\n[")
    main = main.replace(
        "lxc.cgroup2.devices.allow: c 511:* rwm\n", "lxc.cgroup2.devices.allow: c 511:* rwm # uvm\n"
    )
    p.write_text(main + sep + rest)
    before = _conf(sim)
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    assert rc == 0, doc
    assert _conf(sim) == before  # recognised: no duplicate rule added
    assert _steps(doc)["cuda"]["status"] == "ok"


def test_a_foreign_line_that_stops_the_start_does_not_stop_gpubox_fixing_its_own(tmp_path, capsys):
    """A devN whose device is gone (someone unplugged the iGPU) and a stale uvm rule: gpubox's own
    lines are rewritten now, without a restart, and the foreign line is named with its repair."""
    sim = _box(tmp_path, "uvm_stale_major")
    _edit_main(sim, "dev7: /dev/dri/card9,gid=44")
    boots = _boots(sim)
    rc, doc = _json(capsys, sim, "fix", "ct200", "--yes")
    text = _conf(sim).decode()
    main = text.split("\n[")[0]
    assert "lxc.cgroup2.devices.allow: c 511:* rwm" in main and "c 508:* rwm" not in main
    assert "dev7: /dev/dri/card9,gid=44" in main  # not gpubox's: byte-identical
    assert rc == 1 and _boots(sim) == boots  # problems remain; no restart into a start that fails
    said = json.dumps(doc)
    assert "`dev7: /dev/dri/card9,gid=44`" in said and "reconnect the device" in said
    assert "remove the `dev7` line" in said
