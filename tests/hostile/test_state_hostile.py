"""Names from the inventory never become paths outside the state directory (one helper:
gpubox.state.safe_name), and long names never hit NAME_MAX."""

from __future__ import annotations

import pytest

from gpubox import state

NAMES = [
    "../../../../tmp/x",
    "..",
    ".",
    "/etc/passwd",
    "a/b",
    "x" * 300,
    "é" * 200,
    "a\x00b",
    "a\nb",
    "-rf",
    " ",
    "",
    "ct200",
    "pve1.lan",
    "CON",
    "a" * 96,
    "a" * 97,
    "~root",
    "$(id)",
]


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_backup_and_lock_paths_stay_inside(tmp_path, name):
    root = state.state_dir().resolve()
    paths = [
        lambda: state.backup_path(name, "/etc/pve/lxc/200.conf"),
        lambda: state.backup_path("pve1", "/" + name),
    ]
    try:  # the results paths (the box lock lives on the host now: gpubox.boxlock, by vmid)
        from gpubox.identity import box_id

        paths += [lambda: state.sub_dir("results", name), lambda: state.sub_dir("results", box_id(name, 200))]
    except ImportError:
        paths += [lambda: state.sub_dir("results", name)]
    for make in paths:
        p = make()
        assert p.resolve().is_relative_to(root), f"DAMAGE: {p} is outside the state directory"
        assert all(len(part.encode()) <= 255 for part in p.parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()


def test_distinct_names_get_distinct_files():
    names = ["a/b", "a_b", "a b", "x" * 300, "x" * 301]
    assert len({state.safe_name(n) for n in names}) == len(names)
