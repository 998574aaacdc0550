"""The inventory: resolved exactly as Ansible resolves it (cross-checked with ansible-inventory),
and the bad-input cases give one-line errors with exit status 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpubox.errors import InventoryError
from gpubox.inventory import Inventory

from .clirun import gpubox

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "inventory" / "example.yml"


def ansible_inventory(path: Path) -> dict:
    exe = shutil.which("ansible-inventory")
    argv = [exe] if exe else [sys.executable, "-m", "ansible.cli.inventory"]
    out = subprocess.run(
        [*argv, "-i", str(path), "--list"], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def ansible_groups(doc: dict) -> dict[str, set[str]]:
    """host -> every group it is in (transitively through children), as Ansible lists them."""
    direct: dict[str, set[str]] = {}
    parents: dict[str, set[str]] = {}
    for g, body in doc.items():
        if g == "_meta":
            continue
        for h in body.get("hosts", []):
            direct.setdefault(h, set()).add(g)
        for c in body.get("children", []):
            parents.setdefault(c, set()).add(g)
    out = {}
    for h, gs in direct.items():
        todo, seen = list(gs), set()
        while todo:
            g = todo.pop()
            if g not in seen:
                seen.add(g)
                todo.extend(parents.get(g, ()))
        out[h] = seen - {"all", "ungrouped"}
    return out


def _same_as_ansible(inv: Inventory, path: Path, templated: set[str] = frozenset()) -> None:
    doc = ansible_inventory(path)
    hv = doc["_meta"]["hostvars"]
    assert set(inv.hosts) == set(hv)
    groups = ansible_groups(doc)
    for name, entry in inv.hosts.items():
        ours = json.loads(json.dumps(entry.public_vars()))
        theirs = {k: v for k, v in hv[name].items() if k not in templated}
        assert {k: v for k, v in ours.items() if k not in templated} == theirs, name
        assert set(entry.groups) == groups.get(name, set()), name


# ------------------------------------------------------------------------------ example.yml
def test_example_matches_ansible_inventory():
    inv = Inventory(EXAMPLE)
    _same_as_ansible(inv, EXAMPLE)
    assert inv.box_names() == ["ct200"]
    box = inv.box("ct200")
    assert (box.vmid, box.host.name, box.host.get("ansible_host")) == (200, "pve1", "192.0.2.10")
    assert box.var("gpubox_pcie_mrrs") == 4096  # falls back to the Proxmox host's value
    assert box.var("gpubox_gpus") == 8
    assert box.container.get("gpubox_numa_nodes") == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    assert box.container.root == "/" and box.host.root == "/"


def test_example_every_variable_is_documented():
    """Each gpubox_* key set in example.yml has a comment on its line or just above it."""
    lines = EXAMPLE.read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("gpubox_") and ":" in s:
            above = lines[i - 1].strip() if i else ""
            if "#" not in line and not above.startswith("#"):
                undocumented.append(s.split(":")[0])
    assert not undocumented


# ------------------------------------------------------------------------------ directories
def write_tree(base: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return base


DIR_INVENTORY = {
    "hosts.yml": """\
        all:
          vars: {level: all_inline, only_all: inline, ansible_user: root}
          children:
            proxmox_hosts:
              hosts:
                pve1: {ansible_host: 10.0.0.1}
            gpu_containers:
              vars: {level: gpu_inline, gpubox_proxmox_host: pve1, gpubox_gpus: 4, only_all: gpu_inline}
              children:
                big_boxes:
                  vars: {level: big_inline, gpubox_gpus: 8}
                  hosts:
                    ct200: {gpubox_vmid: 200}
                    ct201: {gpubox_vmid: 201, level: host_inline}
        """,
    "group_vars/all.yml": "from_gv_all: 1\nonly_all: gv_all\n",
    "group_vars/gpu_containers.yml": "nccl: from_gv_gpu\ngpubox_model: {source: /mnt/m, dest: /dev/shm/m}\n",
    "group_vars/big_boxes/main.yml": "nccl: from_gv_big\n",
    "host_vars/ct201.yml": 'level: host_vars_file\nmodel_path: "/dev/shm/{{ inventory_hostname }}"\n',
}


def test_directory_inventory_resolves_with_ansible_precedence(tmp_path):
    d = write_tree(tmp_path / "inv", DIR_INVENTORY)
    inv = Inventory(d)
    _same_as_ansible(inv, d, templated={"model_path"})
    ct200, ct201, pve1 = inv.host("ct200"), inv.host("ct201"), inv.host("pve1")
    assert ct200.get("level") == "big_inline"  # child group beats its parent
    assert ct200.get("gpubox_gpus") == 8
    assert ct200.get("nccl") == "from_gv_big"  # child's group_vars/ beat the parent's
    assert ct201.get("level") == "host_vars_file"  # host_vars/ beat inline host vars
    assert ct201.get("model_path") == "/dev/shm/ct201"  # templated like Ansible does at run time
    assert pve1.get("nccl") is None and pve1.get("from_gv_all") == 1
    assert ct200.groups == ["big_boxes", "gpu_containers"]
    assert inv.box_names() == ["ct200", "ct201"]
    assert inv.box("ct201").host.name == "pve1"


def test_default_inventory_from_environment(tmp_path, monkeypatch, capsys):
    d = write_tree(tmp_path / "inv", DIR_INVENTORY)
    monkeypatch.setenv("GPUBOX_INVENTORY", str(d))
    assert Inventory().path == d
    rc, out, _ = gpubox(capsys, "inventory", "list", "--json")
    assert rc == 0 and [b["box"] for b in json.loads(out)["boxes"]] == ["ct200", "ct201"]


# ------------------------------------------------------------------------------ bad input
def test_malformed_yaml_names_file_and_line(tmp_path, capsys):
    d = write_tree(tmp_path / "inv", dict(DIR_INVENTORY))
    bad = d / "group_vars" / "gpu_containers.yml"
    bad.write_text("nccl: ok\ngpubox_model: {source: /mnt/m\nother: 1\n")
    with pytest.raises(InventoryError, match=rf"malformed YAML at {bad}:\d+"):
        Inventory(d)
    rc, out, err = gpubox(capsys, "-i", str(d), "inventory", "list")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"gpubox: error: malformed YAML at {bad}:")
    assert "Traceback" not in err


def test_malformed_yaml_line_number_is_the_bad_line(tmp_path):
    f = tmp_path / "inv.yml"
    f.write_text("all:\n  hosts:\n    ct200:\n      gpubox_vmid: 200\n      x: [1, 2\n    pve1: {}\n")
    with pytest.raises(InventoryError) as ei:
        Inventory(f)
    line = int(str(ei.value).split(f"{f}:")[1].split(":")[0])
    assert line in (5, 6)  # the unclosed list opens on line 5; YAML notices on line 6


def test_wrong_structure_is_an_error_not_an_empty_inventory(tmp_path, capsys):
    """Ansible alone would warn per plugin and go on with no hosts; gpubox stops with the cause."""
    f = tmp_path / "inv.yml"
    f.write_text("all:\n  hosts:\n    - pve1\n    - ct200\n")
    rc, out, err = gpubox(capsys, "-i", f, "inventory", "list")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f'gpubox: error: cannot read inventory {f}: Invalid "hosts" entry for "all" group')
    assert "requires a dictionary, found list" in err and "WARNING" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InventoryError, match="cannot read inventory"):
        Inventory(empty)


def test_templates_resolve_or_stay_as_ansible_would(tmp_path):
    f = tmp_path / "inv.yml"
    f.write_text(
        textwrap.dedent("""\
        all:
          vars: {models: /mnt/models}
          hosts:
            pve1: {}
            ct200:
              gpubox_vmid: 200
              gpubox_proxmox_host: pve1
              gpubox_model: {source: "{{ models }}/Q", dest: "/dev/shm/{{ inventory_hostname }}"}
              play_only: "{{ ansible_default_ipv4.address }}"
        """)
    )
    ct = Inventory(f).host("ct200")
    assert ct.get("gpubox_model") == {"source": "/mnt/models/Q", "dest": "/dev/shm/ct200"}
    assert ct.get("play_only") == "{{ ansible_default_ipv4.address }}"  # facts exist only in a play
    f.write_text(f.read_text().replace("pve1: {}", "pve1: {ansible_host: '{{ nowhere }}'}"))
    with pytest.raises(
        InventoryError, match="pve1: variable ansible_host cannot be resolved: 'nowhere' is undefined"
    ):
        Inventory(f)


def test_not_a_mapping(tmp_path):
    f = tmp_path / "inv.yml"
    f.write_text("- pve1\n- ct200\n")
    with pytest.raises(InventoryError, match="is not a YAML mapping"):
        Inventory(f)


def test_unknown_box_lists_known_ones(capsys):
    rc, out, err = gpubox(capsys, "-i", str(EXAMPLE), "inventory", "show", "ct999")
    assert rc == 2 and out == ""
    assert err == f"gpubox: error: unknown box 'ct999' in {EXAMPLE} (known boxes: ct200)\n"
    # A Proxmox host is not a box either.
    with pytest.raises(InventoryError, match="known boxes: ct200"):
        Inventory(EXAMPLE).box("pve1")


def test_box_without_proxmox_host(tmp_path, capsys):
    f = tmp_path / "inv.yml"
    f.write_text("all:\n  hosts:\n    ct200: {gpubox_vmid: 200}\n")
    rc, _, err = gpubox(capsys, "-i", str(f), "inventory", "show", "ct200")
    assert rc == 2
    assert err == (
        "gpubox: error: ct200: gpubox_proxmox_host is missing "
        "(set gpubox_proxmox_host to the inventory name of its Proxmox host)\n"
    )
    f.write_text("all:\n  hosts:\n    pve7: {}\n    ct200: {gpubox_vmid: 200, gpubox_proxmox_host: pve1}\n")
    with pytest.raises(InventoryError, match="'pve1' is not in the inventory.*name one of: pve7"):
        Inventory(f).box("ct200")
    f.write_text("all:\n  hosts:\n    pve1: {}\n    ct200: {gpubox_vmid: two, gpubox_proxmox_host: pve1}\n")
    with pytest.raises(InventoryError, match="gpubox_vmid = 'two' is not a whole number"):
        Inventory(f).box("ct200")


def test_missing_inventory(tmp_path, capsys):
    rc, _, err = gpubox(capsys, "-i", str(tmp_path / "nope.yml"), "inventory", "list")
    assert rc == 2 and "does not exist" in err and "GPUBOX_INVENTORY" in err


# ------------------------------------------------------------------------------ CLI
def test_inventory_list_json(capsys):
    rc, out, _ = gpubox(capsys, "-i", str(EXAMPLE), "inventory", "list", "--json")
    doc = json.loads(out)
    assert rc == 0
    assert doc["hosts"] == ["pve1"]
    assert doc["boxes"] == [
        {
            "box": "ct200",
            "vmid": 200,
            "proxmox_host": "pve1",
            "connection": "ssh",
            "root": "/",
            "host_root": "/",
            "groups": ["gpu_containers"],
        }
    ]


def test_inventory_show_json_matches_ansible(capsys):
    rc, out, _ = gpubox(capsys, "-i", str(EXAMPLE), "inventory", "show", "ct200", "--json")
    doc = json.loads(out)
    hv = ansible_inventory(EXAMPLE)["_meta"]["hostvars"]
    assert rc == 0 and doc["box"] == "ct200" and doc["vmid"] == 200
    assert doc["container"]["vars"] == hv["ct200"]
    assert doc["proxmox_host"]["name"] == "pve1" and doc["proxmox_host"]["vars"] == hv["pve1"]


def test_inventory_tables_for_people(capsys):
    rc, out, _ = gpubox(capsys, "-i", str(EXAMPLE), "inventory", "list")
    assert rc == 0 and "ct200" in out and "pve1" in out and "200" in out
    rc, out, _ = gpubox(capsys, "-i", str(EXAMPLE), "inventory", "show", "ct200")
    assert rc == 0 and "gpubox_proxmox_host" in out and "gpubox_pcie_mrrs" in out


def test_an_ini_inventory_is_named_and_ansibles_own_conversion_is_read_alike(tmp_path):
    """An INI inventory is not misread as broken YAML: the one line names the format and the
    conversion, and what that conversion writes is read by gpubox with Ansible's values."""
    import shutil
    import subprocess
    import sys

    from gpubox.errors import InventoryError

    ini = tmp_path / "hosts.ini"
    ini.write_text(
        "# fleet\n[pve]\npve1 ansible_host=127.0.0.1\n\n[ct]\nct200 gpubox_vmid=200 gpubox_proxmox_host=pve1\n"
    )
    with pytest.raises(InventoryError) as ei:
        Inventory(ini)
    assert "INI format" in ei.value.problem and f"ansible-inventory -i {ini}" in ei.value.fix
    tool = Path(sys.executable).with_name("ansible-inventory")
    tool = str(tool) if tool.exists() else shutil.which("ansible-inventory")
    if tool is None:
        pytest.skip("ansible-inventory is not installed")
    yml = tmp_path / "inventory.yml"
    out = subprocess.run(
        [tool, "-i", str(ini), "--list", "--yaml"], capture_output=True, text=True, check=True
    )
    yml.write_text(out.stdout)
    box = Inventory(yml).box("ct200")
    assert box.vmid == 200 and box.host.name == "pve1" and box.host.vars["ansible_host"] == "127.0.0.1"
