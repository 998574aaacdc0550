"""The inventory is read as Ansible reads it (a YAML 1.1 resolver), and every number or boolean
gpubox reads whose spelling YAML reinterprets is refused with one line: `gpubox_vmid: 0200` is
octal 128 to Ansible, so `lxc fix` would edit another container's config.

The differential: for spellings drawn by Hypothesis (leading zeros, signs, 0x/0o/0b, underscores,
base-60 colons), PyYAML's resolver (Ansible's) decides what the scalar is; when it is an integer
whose text is not plain decimal, loading the inventory must refuse it naming the variable, and
when it is plain decimal, the value gpubox uses must equal int(text). Aliases are bounded in
group_vars/ and host_vars/ too (an alias bomb there hung before)."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpubox.errors import InventoryError
from gpubox.inventory import Inventory
from gpubox.invspell import check_spellings

PLAIN = re.compile(r"[-+]?(0|[1-9][0-9]*)")
HOSTS = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve1: {{ansible_connection: local}}
    gpu_containers:
      hosts:
        ct1: {{gpubox_vmid: {vmid}, gpubox_proxmox_host: pve1}}
"""


def _inv(tmp_path, vmid="200", group_vars: str | None = None, host_vars: str | None = None):
    inv = tmp_path / "hosts.yml"
    inv.write_text(HOSTS.format(vmid=vmid))
    if group_vars is not None:
        (tmp_path / "group_vars").mkdir(exist_ok=True)
        (tmp_path / "group_vars" / "gpu_containers.yml").write_text(group_vars)
    if host_vars is not None:
        (tmp_path / "host_vars").mkdir(exist_ok=True)
        (tmp_path / "host_vars" / "ct1").write_text(host_vars)  # no extension: Ansible loads it
    return inv


@pytest.mark.parametrize(
    "text, reading, fix",
    [
        ("0200", "octal 128", "write 200"),
        ("0x10", "hex 16", "write 16"),
        ("0o310", None, None),  # YAML 1.1 has no 0o: a string, refused by the schema instead
        ("1:20", "base-60 80", "write 80"),
        ("1_000", "1000", "write 1000"),
        ("0b11001000", "binary 200", "write 200"),
        ("+0200", "octal 128", "write 200"),
    ],
)
def test_reinterpreted_vmid_is_refused_naming_it(tmp_path, text, reading, fix):
    with pytest.raises(InventoryError) as ei:
        Inventory(_inv(tmp_path, text)).box("ct1")
    msg = str(ei.value)
    assert "gpubox_vmid" in msg and "\n" not in msg
    if reading:
        assert f"YAML would read it as {reading}" in msg and fix in msg and "hosts.yml:8" in msg


def test_quoted_leading_zero_is_refused_too(tmp_path):
    with pytest.raises(InventoryError, match="leading zero"):
        Inventory(_inv(tmp_path, '"0200"')).box("ct1")


def test_in_group_vars_and_host_vars_too(tmp_path):
    with pytest.raises(InventoryError, match=r"group_vars/gpu_containers.yml:1: gpubox_gpus 010"):
        Inventory(_inv(tmp_path, group_vars="gpubox_gpus: 010\n"))
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(InventoryError, match=r"host_vars/ct1:1: ansible_port 0x16"):
        Inventory(_inv(other, host_vars="ansible_port: 0x16\n"))


def test_booleans_where_text_is_read(tmp_path):
    with pytest.raises(
        InventoryError, match="gpubox_proxmox_host no would be read by YAML as the boolean false"
    ):
        Inventory(_inv(tmp_path, group_vars="gpubox_proxmox_host: no\n"))
    (tmp_path / "group_vars" / "gpu_containers.yml").write_text("gpubox_env: {NCCL_P2P_DISABLE: on}\n")
    with pytest.raises(InventoryError, match="boolean true"):
        Inventory(_inv(tmp_path))


def test_what_gpubox_does_not_read_is_left_to_ansible(tmp_path):
    """`mode: 0644` in a role's vars is meant as octal: not gpubox's to refuse."""
    inv = Inventory(_inv(tmp_path, group_vars="mode: 0644\nenabled: yes\ngpubox_simulated: no\n"))
    assert inv.box("ct1").vmid == 200


def test_alias_bomb_in_group_vars_is_refused(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    prev = "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    with pytest.raises(InventoryError, match="alias"):
        Inventory(_inv(tmp_path, group_vars="\n".join(lines) + "\n"))


SPELLING = st.one_of(
    st.from_regex(r"\A[-+]?0[0-7_]{1,6}\Z"),
    st.from_regex(r"\A[-+]?0x[0-9a-fA-F_]{1,6}\Z"),
    st.from_regex(r"\A[-+]?0b[01_]{1,8}\Z"),
    st.from_regex(r"\A[-+]?[1-9][0-9_]{0,5}(:[0-5]?[0-9]){1,2}\Z"),
    st.from_regex(r"\A[-+]?[1-9][0-9_]{0,8}\Z"),
    st.from_regex(r"\A[-+]?(0|[1-9][0-9]{0,8})\Z"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=SPELLING)
def test_every_yaml11_integer_spelling_is_plain_or_refused(text):
    """Differential against the resolver Ansible uses: what YAML reads as an int is either
    spelled plainly (and means int(text)) or refused by the spelling check."""
    source = f"gpubox_vmid: {text}\n"
    node = yaml.compose(source, Loader=yaml.SafeLoader)
    scalar = node.value[0][1]
    if scalar.tag != "tag:yaml.org,2002:int":
        return  # a string to YAML: the schema judges it (digits only, no leading zero)
    if PLAIN.fullmatch(text):
        check_spellings("inv.yml", node)
        assert yaml.safe_load(source)["gpubox_vmid"] == int(text)
    else:
        with pytest.raises(InventoryError, match="not a plain decimal number"):
            check_spellings("inv.yml", node)


@pytest.mark.parametrize("root", ["//srv/box", "/srv/./box", "/srv/../etc", "/srv//box"])
def test_gpubox_root_is_one_canonical_spelling(tmp_path, root):
    with pytest.raises(InventoryError, match="not a canonical path"):
        Inventory(_inv(tmp_path, group_vars=f"gpubox_root: {root}\n"))
