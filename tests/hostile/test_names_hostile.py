"""Names that cannot collide: units, history and results keyed by the box's identity (Proxmox host +
vmid), injectively. Before, a lossy slug gave gpu.a and gpu_a one systemd unit, and two inventories'
ct200 shared one history (doctor on a box never benchmarked reported the other box's run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpubox.inventory import Inventory
from gpubox.simbox import build
from tests.clirun import gpubox

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "history"


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=120), st.text(min_size=1, max_size=120))
def test_encoding_is_injective_and_file_safe(a, b):
    from gpubox.identity import decode_name, encode_name

    ea, eb = encode_name(a), encode_name(b)
    assert all(c.isascii() and (c.isalnum() or c in "_-") for c in ea)
    assert len(ea) <= 80
    if a != b:
        assert ea != eb, f"DAMAGE: {a!r} and {b!r} share the name {ea}"
    if "__" not in ea:
        assert decode_name(ea) == a


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=60), st.integers(100, 999_999_999), st.text(min_size=1, max_size=60))
def test_box_id_round_trips_and_never_meets_a_name_key(host, vmid, name):
    from gpubox.bench.history import store_key
    from gpubox.identity import box_id, parse_box_id

    bid = box_id(host, vmid)
    h, v = parse_box_id(bid)
    assert v == vmid and (h is None or h == host)
    assert store_key(name) != bid, "DAMAGE: a name's history is a box's history"


def _two_box_inventory(tmp_path: Path, names) -> Path:
    cts = {
        n: {"gpubox_vmid": 201 + i, "gpubox_proxmox_host": "pve1", "ansible_connection": "local"}
        for i, n in enumerate(names)
    }
    inv = {
        "all": {
            "children": {
                "proxmox_hosts": {
                    "hosts": {"pve1": {"ansible_connection": "local", "gpubox_root": str(tmp_path)}}
                },
                "gpu_containers": {"hosts": cts},
            }
        }
    }
    p = tmp_path / "inv.yml"
    p.write_text(yaml.safe_dump(inv))
    return p


@pytest.mark.parametrize("names", [("gpu.a", "gpu_a"), ("ct 1", "ct_1"), ("Box", "box"), ("a/b", "a_b")])
def test_two_boxes_never_share_a_health_check_unit(tmp_path, names):
    from gpubox.bench.schedule import spec_from

    try:
        inv = Inventory(_two_box_inventory(tmp_path, names))
        specs = [spec_from(inv.box(n)) for n in names]
    except Exception as exc:  # a name the schedule refuses outright is not a collision
        pytest.skip(f"refused: {exc}")
    assert specs[0].timer != specs[1].timer, f"DAMAGE: {names} share {specs[0].timer}"
    assert specs[0].cron_file != specs[1].cron_file


def _sim_named(tmp_path: Path, host: str):
    sim = build(tmp_path / host, (), host=host)
    return sim


def _record(capsys, sim, n: int) -> None:
    rc, out, err = gpubox(
        capsys,
        "-i",
        sim.inventory_path,
        "schedule",
        "run-once",
        "ct200",
        "--no-doctor",
        "--json",
        "--from-json",
        FIX / f"run{n:02d}.json",
    )
    assert rc in (0, 1), err


def test_history_of_a_namesake_box_is_not_shown(tmp_path, capsys):
    """ct200 on pve1 and ct200 on pve2 (two inventories, one control node)."""
    a, b = _sim_named(tmp_path, "pve1"), _sim_named(tmp_path, "pve2")
    _record(capsys, a, 1)
    _record(capsys, a, 2)
    rc, out, err = gpubox(capsys, "-i", b.inventory_path, "history", "ct200", "--json")
    runs = json.loads(out)["runs"] if rc == 0 else []
    assert runs == [], f"DAMAGE: `history ct200` of pve2 shows pve1's runs: {[r['run_id'] for r in runs]}"
    rc, out, err = gpubox(capsys, "-i", a.inventory_path, "history", "ct200", "--json")
    assert rc == 0 and len(json.loads(out)["runs"]) == 2


def test_doctor_on_a_never_benchmarked_box_reports_no_other_boxes_run(tmp_path, capsys):
    a, b = _sim_named(tmp_path, "pve1"), _sim_named(tmp_path, "pve2")
    _record(capsys, a, 1)
    rc, out, err = gpubox(capsys, "-i", b.inventory_path, "doctor", "ct200", "--json", "--only", "bench")
    steps = {s["name"]: s for s in json.loads(out)["steps"]}
    detail = steps["bench"]["detail"]
    assert "latest benchmark" not in detail, f"DAMAGE: doctor of pve2/ct200 reports pve1's run: {detail}"
    assert "no benchmark result" in detail


def test_doctor_shows_the_latest_result_age(tmp_path, capsys):
    a = _sim_named(tmp_path, "pve1")
    _record(capsys, a, 1)
    rc, out, err = gpubox(capsys, "-i", a.inventory_path, "doctor", "ct200", "--json", "--only", "bench")
    detail = {s["name"]: s for s in json.loads(out)["steps"]}["bench"]["detail"]
    assert " old" in detail or "age unknown" in detail, detail
