"""`gpubox backups BOX`: the copies gpubox kept of what it changed, shown, compared and put back."""

from __future__ import annotations

import json

from gpubox.simbox import build
from tests.clirun import gpubox


def _recovered(tmp_path, capsys):
    sim = build(tmp_path / "box", ["uvm_stale_major", "nccl_misspelled"], gpus=2)
    before = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--no-bench")
    assert rc == 0, err
    return sim, before


def test_list_diff_and_restore_the_container_config(tmp_path, capsys):
    sim, before = _recovered(tmp_path, capsys)
    inv = str(sim.inventory_path)
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--json")
    kept = json.loads(out)
    conf = [b for b in kept if b["path"] == "/etc/pve/lxc/200.conf"]
    assert rc == 0 and conf and conf[0]["host"] == "pve1"
    assert any(b["host"] == "ct200" and b["path"] == "/etc/gpubox/nccl.env" for b in kept), kept
    n = conf[0]["number"]
    fixed = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--diff", str(n))
    assert (
        rc == 0
        and "-lxc.cgroup2.devices.allow: c 511:* rwm" in out
        and "+lxc.cgroup2.devices.allow: c 508:* rwm" in out
    )
    # without a terminal and without --yes: refused, nothing changed
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--restore", str(n))
    assert rc == 2 and "--yes" in err and sim.hpath("/etc/pve/lxc/200.conf").read_text() == fixed
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--restore", str(n), "--dry-run")
    assert rc == 0 and sim.hpath("/etc/pve/lxc/200.conf").read_text() == fixed
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--restore", str(n), "--yes", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["changed"] and sim.hpath("/etc/pve/lxc/200.conf").read_text() == before
    # the restore kept what it replaced: it can be undone the same way (backup 1 is now that one)
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--show", "1")
    assert rc == 0 and out == fixed
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--restore", "1", "--yes")
    assert rc == 0 and sim.hpath("/etc/pve/lxc/200.conf").read_text() == fixed


def test_a_container_file_is_restored_in_the_container(tmp_path, capsys):
    sim, _ = _recovered(tmp_path, capsys)
    inv = str(sim.inventory_path)
    kept = json.loads(gpubox(capsys, "-i", inv, "backups", "ct200", "--json")[1])
    (env,) = [b for b in kept if b["path"] == "/etc/gpubox/nccl.env"]
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--restore", str(env["number"]), "--yes")
    assert rc == 0, err
    assert "NCCL_PROTO=LL,Simpel" in sim.cpath("/etc/gpubox/nccl.env").read_text()


def test_bad_numbers_and_options_are_one_line(tmp_path, capsys):
    sim, _ = _recovered(tmp_path, capsys)
    inv = str(sim.inventory_path)
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--diff", "99")
    assert rc == 2 and "no backup number 99" in err and len(err.strip().splitlines()) == 1
    rc, out, err = gpubox(capsys, "-i", inv, "backups", "ct200", "--diff", "1", "--show", "1")
    assert rc == 2 and "one of" in err


def test_a_name_that_cannot_be_read_back_has_no_path():
    from gpubox.provision.backups import original_path
    from gpubox.state import safe_name

    assert original_path("etc__pve__lxc__200.conf") == "/etc/pve/lxc/200.conf"
    for path in ("/etc/" + "a" * 200, "/etc/my file.conf"):  # hashed by backup_path: not readable back
        flat = safe_name(path.strip("/").replace("/", "__"), limit=160)
        assert flat != path.strip("/").replace("/", "__") and original_path(flat) is None


def test_backup_stamps_order_as_taken(tmp_path, monkeypatch):
    """Backups are numbered by their stamp: stamps taken one after another must sort in that order
    (a stamp whose sub-second part came from another clock read, or from nanoseconds, did not)."""
    from gpubox.state import backup_path

    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path))
    stamps = [backup_path("pve1", "/etc/x").name.rsplit(".", 1)[1] for _ in range(3000)]
    assert stamps == sorted(stamps)
