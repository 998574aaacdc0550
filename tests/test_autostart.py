"""`gpubox autostart` and `gpubox sim reboot`: the hookscript's phases in Proxmox's order, the pre-start
policy, a user's own hookscript chained, a killed hook, remove's byte-for-byte restore, and the
whole reboot with no command typed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.simbox import build
from tests.bench_helpers import fell_behind
from tests.clirun import gpubox

CONF = "/etc/pve/lxc/200.conf"
SNIPPETS = "/var/lib/vz/snippets"


def _env(sim):
    env = dict(os.environ, GPUBOX_SIM=str(sim.dest), GPUBOX_SIM_SIDE="host")
    env["PATH"] = f"{sim.bin_dir}:{env['PATH']}"
    return env


def pct(sim, *argv):
    p = subprocess.run(
        [str(sim.bin_dir / "pct"), *map(str, argv)], env=_env(sim), capture_output=True, text=True
    )
    return p.returncode, p.stdout + p.stderr


def cli(sim, capsys, *argv):
    return gpubox(capsys, "-i", sim.inventory_path, *argv)


def snippet(sim, phase, env=None):
    """The hookscript as Proxmox calls it: `<script> <vmid> <phase>`."""
    p = subprocess.run(
        [str(sim.hpath(f"{SNIPPETS}/gpubox-ct200.sh")), "200", phase],
        env=env or _env(sim),
        capture_output=True,
        text=True,
    )
    return p.returncode, p.stderr


def user_hook(sim, name="user.sh", rc=0):
    """A user's own hookscript: records its argv, exits rc."""
    p = sim.hpath(f"{SNIPPETS}/{name}")
    p.parent.mkdir(parents=True, exist_ok=True)
    log = sim.dest / "user-hook.log"
    p.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit {rc}\n')
    p.chmod(0o755)
    return log


@pytest.fixture
def box(tmp_path):
    return build(tmp_path / "box", [], gpus=1)


def test_dry_run_shows_snippet_unit_and_pct_set_and_changes_nothing(box, capsys):
    before = box.hpath(CONF).read_bytes()
    rc, out, _ = cli(box, capsys, "autostart", "install", "ct200", "--dry-run")
    assert rc == 1, out  # not installed yet: drift
    assert "#!/bin/sh" in out and "autostart hook ct200" in out
    assert "Before=pve-guests.service" in out and "After=pve-cluster.service" in out
    assert "would run: pct set 200 --hookscript local:snippets/gpubox-ct200.sh" in out
    assert box.hpath(CONF).read_bytes() == before
    assert not box.hpath(f"{SNIPPETS}/gpubox-ct200.sh").exists()


def test_install_is_idempotent_and_remove_restores_absence_byte_for_byte(box, capsys):
    pct(box, "set", 200, "--delete", "hookscript")  # the config as Proxmox writes it
    before = box.hpath(CONF).read_bytes()
    assert cli(box, capsys, "autostart", "status", "ct200")[0] == 1
    rc, out, _ = cli(box, capsys, "autostart", "install", "ct200", "--yes", "--json")
    assert rc == 0 and json.loads(out)["changed"], out
    assert b"hookscript: local:snippets/gpubox-ct200.sh\n" in box.hpath(CONF).read_bytes()
    assert os.access(box.hpath(f"{SNIPPETS}/gpubox-ct200.sh"), os.X_OK)
    rc, out, _ = cli(box, capsys, "autostart", "install", "ct200", "--yes", "--json")
    assert rc == 0 and not json.loads(out)["changed"]
    assert cli(box, capsys, "autostart", "status", "ct200")[0] == 0
    rc, out, _ = cli(box, capsys, "autostart", "remove", "ct200")
    assert rc == 0, out
    assert box.hpath(CONF).read_bytes() == before
    assert not box.hpath(f"{SNIPPETS}/gpubox-ct200.sh").exists()
    assert not box.hpath("/etc/systemd/system/gpubox-autostart-ct200.service").exists()
    assert cli(box, capsys, "autostart", "status", "ct200")[0] == 1


def test_users_hookscript_is_chained_and_restored(box, capsys):
    log = user_hook(box)
    assert pct(box, "set", 200, "--hookscript", "local:snippets/user.sh")[0] == 0
    before = box.hpath(CONF).read_bytes()
    assert cli(box, capsys, "autostart", "install", "ct200", "--yes")[0] == 0
    text = box.hpath(f"{SNIPPETS}/gpubox-ct200.sh").read_text()
    assert f"--chain {SNIPPETS}/user.sh" in text
    rc, err = snippet(box, "pre-start")
    assert rc == 0, err
    assert log.read_text() == "200 pre-start\n"  # called first, with Proxmox's argv
    assert cli(box, capsys, "autostart", "remove", "ct200")[0] == 0
    assert box.hpath(CONF).read_bytes() == before
    assert box.hpath(f"{SNIPPETS}/user.sh").exists()


def test_users_failing_pre_start_is_honoured(box, capsys):
    user_hook(box, rc=3)
    pct(box, "set", 200, "--hookscript", "local:snippets/user.sh")
    assert cli(box, capsys, "autostart", "install", "ct200", "--yes")[0] == 0
    rc, err = snippet(box, "pre-start")
    assert rc == 3 and "refused by the chained hookscript" in err


def test_existing_refuse_leaves_the_config_alone(box, capsys):
    user_hook(box)
    pct(box, "set", 200, "--hookscript", "local:snippets/user.sh")
    before = box.hpath(CONF).read_bytes()
    rc, out, _ = cli(box, capsys, "autostart", "install", "ct200", "--yes", "--existing", "refuse")
    assert rc == 1 and "never replaces it" in out
    assert box.hpath(CONF).read_bytes() == before


def wait_for_deferred_fix(sim, limit=240):
    """The deferred config fix logs `boot: done` when it ends (a bound on waiting, not a timing claim)."""
    import time

    log = sim.hpath("/var/log/gpubox/autostart-ct200.log")
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if log.exists() and "boot: done" in log.read_text():
            return log.read_text()
        time.sleep(0.2)
    raise AssertionError(log.read_text() if log.exists() else "no log")


@pytest.mark.parametrize("policy", ["refuse", "degrade"])
def test_pre_start_stale_rules_policy(tmp_path, capsys, policy):
    sim = build(tmp_path / "b", ["uvm_stale_major", "container_stopped"], gpus=1)
    assert cli(sim, capsys, "autostart", "install", "ct200", "--yes", "--policy", policy)[0] == 0
    if policy == "refuse":  # through pct start: vm_start's order, under Proxmox's config lock
        rc, out = pct(sim, "start", 200)
        assert rc == 255, out
        assert "start refused" in out and "hookscript error for 200 on pre-start" in out
        assert "config fix deferred" in out
        # update_lxc_config ran before the hook: this start's config had the stale major
        assert "c 508:* rwm" in sim.hpath("/var/lib/lxc/200/config").read_text()
        assert sim.read_state()["containers"]["200"]["status"] == "stopped"
    else:
        rc, _, err = cli(sim, capsys, "autostart", "hook", "ct200", "200", "pre-start", "--policy", "degrade")
        assert rc == 0 and "degraded start" in err
    log = wait_for_deferred_fix(sim)  # once the start task released the config, the fix ran
    assert "released CT 200's config" in log
    assert "c 508:" not in sim.hpath(CONF).read_text().split("\n[")[0]


def test_pre_start_ok_when_nodes_and_rules_match(box, capsys):
    assert cli(box, capsys, "autostart", "install", "ct200", "--yes")[0] == 0
    rc, _, err = cli(box, capsys, "autostart", "hook", "ct200", "200", "pre-start")
    assert rc == 0 and "match the live /proc/devices" in err
    assert "pre-start" in box.hpath("/var/log/gpubox/autostart-ct200.log").read_text()


def test_server_waits_for_staging_and_post_start_releases_it(tmp_path, capsys):
    from gpubox.bench import history
    from gpubox.inventory import Inventory
    from gpubox.simbox.cmds import systemctl

    sim = build(tmp_path / "b", ["shm_empty"], gpus=1)
    unit = sim.cpath("/etc/systemd/system/vllm.service")
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    with sim.state() as st:
        st["units"].setdefault("container", {})["vllm.service"] = {
            "enabled": True,
            "active": False,
            "starts": 0,
        }
    rc, out, _ = cli(sim, capsys, "autostart", "install", "ct200", "--yes", "--server-unit", "vllm.service")
    assert rc == 0, out
    systemctl.boot_units(sim, "container")  # the container boots on an empty /dev/shm
    assert not sim.read_state()["units"]["container"]["vllm.service"]["active"]
    rc, err = snippet(sim, "post-start")
    st = sim.read_state()["units"]["container"]["vllm.service"]
    assert st["active"] and st["starts"] == 1, err
    assert (sim.cpath("/dev/shm/Qwen3.6-27B-sim") / ".gpubox-manifest.json").exists()
    runs = history.runs(Inventory(sim.inventory_path).box("ct200"))
    assert len(runs) == 1 and "health check:" in err
    assert rc == 0 or fell_behind(sim), err


def test_hook_killed_mid_phase_next_start_converges(tmp_path, capsys):
    """A pre-start killed while it waits for the box lock leaves nothing half-done: the next
    start's hooks converge (rules right, weights staged, a health check recorded)."""
    from gpubox.boxlock import box_lock
    from gpubox.context import Context
    from gpubox.inventory import Inventory

    sim = build(tmp_path / "b", ["shm_empty", "container_stopped"], gpus=1)
    assert cli(sim, capsys, "autostart", "install", "ct200", "--yes")[0] == 0
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box("ct200"), inventory=inv, options={})
    env = dict(_env(sim), GPUBOX_LOCK_WAIT="60")
    env.pop("GPUBOX_BOX_LOCK_HELD", None)
    with box_lock(ctx, "test holds the box"):
        p = subprocess.Popen(
            [str(sim.hpath(f"{SNIPPETS}/gpubox-ct200.sh")), "200", "pre-start"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in p.stderr:  # it has started its phase, then waits on the lock
            if "pre-start" in line or "waiting" in line:
                break
        p.kill()
        p.wait()
    ctx.close()
    rc, out = pct(sim, "start", 200)
    assert rc == 0, out
    assert (sim.cpath("/dev/shm/Qwen3.6-27B-sim") / ".gpubox-manifest.json").exists()
    assert "post-start: health check:" in out


def test_sim_reboot_without_autostart_names_what_broke(tmp_path, capsys):
    sim = build(tmp_path / "b", [], gpus=1)
    rc, out, _ = gpubox(capsys, "sim", "reboot", sim.dest, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["verdict"] is None and doc["healthy_after_s"] is None
    assert [p["name"] for p in doc["phases"]][0] == "power off"
    rc, out, _ = cli(sim, capsys, "doctor", "ct200")
    assert rc == 1 and "model-stage" in out and "reboot-safe: no" in out


def test_end_to_end_reboot_needs_no_command(tmp_path):
    """The issue's sequence, as a user types it."""
    d = tmp_path / "D"
    env = dict(os.environ)
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "gpubox.cli", *map(str, a)],
        env=env,  # noqa: E731
        capture_output=True,
        text=True,
    )
    assert run("demo", "--keep", d, "--no-bench").returncode == 0
    inv = d / "inventory.yml"
    p = run("-i", inv, "autostart", "install", "ct200", "--yes")
    assert p.returncode == 0, p.stdout + p.stderr
    p = run("sim", "reboot", d, "--driver-upgrade", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] is not None, doc["log"]
    log = "\n".join(doc["log"])
    # the boot unit, before pve-guests, fixed the rule the new major made stale; so pre-start found it right
    assert "boot: container-config fixed" in log and "pre-start: device nodes and rules match" in log
    assert log.index("boot: container-config fixed") < log.index("pre-start:")
    p = run("-i", inv, "doctor", "ct200", "--json")
    rep = json.loads(p.stdout)
    from gpubox.simbox import SimBox

    assert p.returncode == 0 or fell_behind(SimBox.load(d)), p.stdout
    assert rep["reboot_safe"]["ok"]
    bad = [s["name"] for s in rep["steps"] if s["status"] in ("drift", "failed") and s["name"] != "bench"]
    assert bad == []
    h = run("-i", inv, "history", "ct200", "--json")
    assert h.returncode in (0, 1), h.stderr
    assert doc["verdict"] in h.stdout and "health check: " + doc["verdict"] in log


def test_pre_start_is_bounded_by_its_time_limit(box, capsys):
    """A pre-start that cannot finish (here: the box lock is held and it would wait 60 s) stops at
    its limit with the cause in the log; under degrade the start goes on."""
    import yaml

    from gpubox.boxlock import box_lock
    from gpubox.context import Context
    from gpubox.inventory import Inventory

    inv = yaml.safe_load(box.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_autostart"] = {"pre_timeout": "2s"}
    box.inventory_path.write_text(yaml.safe_dump(inv))
    assert cli(box, capsys, "autostart", "install", "ct200", "--yes")[0] == 0
    env = dict(_env(box), GPUBOX_LOCK_WAIT="60")
    env.pop("GPUBOX_BOX_LOCK_HELD", None)
    i = Inventory(box.inventory_path)
    ctx = Context(box=i.box("ct200"), inventory=i, options={})
    with box_lock(ctx, "test holds the box"):
        rc, err = snippet(box, "pre-start", env)
    ctx.close()
    assert rc == 0, err
    assert "stopped: time limit of 2 s reached (exit 0)" in err


def test_snippet_lets_the_guest_start_when_gpubox_is_gone(box, capsys):
    assert cli(box, capsys, "autostart", "install", "ct200", "--yes")[0] == 0
    p = box.hpath(f"{SNIPPETS}/gpubox-ct200.sh")
    p.write_text(
        p.read_text().replace(str(Path(sys.executable).parent / "gpubox"), str(box.dest / "no-gpubox"))
    )
    rc, err = snippet(box, "pre-start")
    assert rc == 0 and "missing: CT 200 pre-start not checked" in err


def test_install_refuses_without_gpubox_on_a_real_host(box, capsys):
    import yaml

    inv = yaml.safe_load(box.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_simulated"] = False
    box.inventory_path.write_text(yaml.safe_dump(inv))
    before = box.hpath(CONF).read_bytes()
    rc, out, _ = cli(box, capsys, "autostart", "install", "ct200", "--yes")
    assert rc == 1 and "/usr/local/bin/gpubox is not on CT 200's Proxmox host" in out
    assert box.hpath(CONF).read_bytes() == before
