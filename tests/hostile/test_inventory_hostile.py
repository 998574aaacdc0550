"""Hostile inventories: wrong types and ranges, an alias bomb, non-UTF-8 bytes, markup-looking
values, and host names that try to become paths. Every case ends in a one-line error that names
the variable (exit 2) or in correct output; nothing is written outside the state directory."""

from __future__ import annotations

import time

import pytest
import yaml

from gpubox.simbox import build
from tests.clirun import gpubox


def _inv(tmp_path, ct: dict, host: dict | None = None, text: str | None = None):
    f = tmp_path / "inv.yml"
    if text is None:
        ct = {"gpubox_vmid": 200, "gpubox_proxmox_host": "pve1", **ct}
        doc = {
            "all": {
                "children": {
                    "proxmox_hosts": {"hosts": {"pve1": host or {}}},
                    "gpu_containers": {"hosts": {"ct200": ct}},
                }
            }
        }
        text = yaml.safe_dump(doc)
    f.write_text(text)
    return f


BAD_VARS = [
    ("gpubox_vmid", 200.7),
    ("gpubox_vmid", -5),
    ("gpubox_vmid", 0),
    ("gpubox_vmid", 99),
    ("gpubox_vmid", 10**12),
    ("gpubox_vmid", "200; reboot"),
    ("gpubox_vmid", True),
    ("gpubox_vmid", [200]),
    ("gpubox_vmid", "２００"),
    ("gpubox_gpus", "abc"),
    ("gpubox_gpus", -1),
    ("gpubox_gpus", 2.5),
    ("gpubox_bench", "fast"),
    ("gpubox_bench", [1, 2]),
    ("gpubox_env", "A=1"),
    ("gpubox_env", {"A": [1]}),
    ("gpubox_bin_dirs", "/usr/bin"),
    ("gpubox_bin_dirs", [1, 2]),
    ("ansible_port", "abc"),
    ("ansible_port", 0),
    ("ansible_port", 70000),
    ("gpubox_root", "relative/path"),
    ("gpubox_root", 5),
    ("gpubox_model", "x"),
    ("gpubox_simulated", "yes"),
    ("gpubox_ct_timeout", -1),
    ("gpubox_numa_balancing", "off"),
    ("gpubox_proxmox_host", ""),
]


@pytest.mark.parametrize("key,value", BAD_VARS, ids=[f"{k}={v!r}" for k, v in BAD_VARS])
def test_bad_value_is_one_line_naming_the_variable(tmp_path, capsys, key, value):
    f = _inv(tmp_path, {key: value})
    rc, out, err = gpubox(capsys, "-i", f, "doctor", "ct200")
    assert rc == 2, out + err
    assert err.count("\n") == 1 and key in err and "internal error" not in err, err


def test_simulated_without_root_refuses(tmp_path, capsys):
    f = _inv(
        tmp_path,
        {"gpubox_simulated": True, "ansible_connection": "local"},
        {"gpubox_simulated": True, "ansible_connection": "local"},
    )
    rc, out, err = gpubox(capsys, "-i", f, "tune", "check", "ct200")
    assert rc == 2 and "gpubox_root" in err, out + err


BOMB = (
    "a: &a [x,x,x,x,x,x,x,x,x]\n"
    + "".join(f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    + "all:\n  hosts:\n    ct200: {gpubox_vmid: 200, gpubox_proxmox_host: pve1, big: *i}\n    pve1: {}\n"
)


def test_alias_bomb_refused_quickly(tmp_path, capsys):
    f = _inv(tmp_path, {}, text=BOMB)
    t0 = time.monotonic()
    rc, out, err = gpubox(capsys, "-i", f, "inventory", "show", "ct200")
    assert time.monotonic() - t0 < 20
    assert rc == 2 and "alias" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "data",
    [b"all:\n  hosts:\n    ct\xff200: {}\n", b"\xfe\xff\x00a\x00l\x00l", b'all: {vars: {x: "\xc3\x28"}}\n'],
)
def test_non_utf8_inventory(tmp_path, capsys, data):
    f = tmp_path / "inv.yml"
    f.write_bytes(data)
    rc, out, err = gpubox(capsys, "-i", f, "inventory", "list")
    assert rc == 2 and "UTF-8" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("value", ["[/path]", "[bold]x[/bold]", "[/]", "[link=file:///etc]x", "\\[x]"])
def test_show_prints_markup_like_values_as_written(tmp_path, capsys, value):
    f = _inv(tmp_path, {"note": value, "gpubox_bin_dirs": ["/opt/x", value]})
    rc, out, err = gpubox(capsys, "-i", f, "inventory", "show", "ct200")
    assert rc == 0, err
    assert value in out.replace("\n", "") or value.replace("\\", "") in out


def test_show_on_simulated_box(tmp_path, capsys):
    sim = build(tmp_path / "box", (), gpus=2)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "inventory", "show", "ct200")
    assert rc == 0 and "gpubox_bin_dirs" in out, err
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "inventory", "list")
    assert rc == 0, err
