"""Shell completion, driven the way bash drives it: the `gpubox` program with _GPUBOX_COMPLETE set,
COMP_WORDS/COMP_CWORD as the shell would pass them, in a subprocess."""

import os
import subprocess
import sys

INV = """all:
  children:
    proxmox_hosts:
      hosts:
        pve1: {}
        pve2: {}
    gpu_containers:
      hosts:
        ct200: {gpubox_vmid: 200, gpubox_proxmox_host: pve1}
        ct201: {gpubox_vmid: 201, gpubox_proxmox_host: pve1}
        cx300: {gpubox_vmid: 300, gpubox_proxmox_host: pve2}
"""


def complete(words: str, env_extra=None):
    parts = words.split()
    cword = len(parts) if words.endswith(" ") else len(parts) - 1
    env = {k: v for k, v in os.environ.items() if k != "GPUBOX_INVENTORY"}
    env.update(_GPUBOX_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(cword), **(env_extra or {}))

    p = subprocess.run(
        [sys.executable, "-m", "gpubox.cli"], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    return [line.split(",", 1)[1] for line in p.stdout.splitlines() if line.startswith("plain,")]


def test_commands_complete():
    got = complete("gpubox re")
    assert got == ["recover", "report"]
    assert "schedule" in complete("gpubox ")


def test_box_names_from_the_inventory(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(INV)
    assert complete(f"gpubox -i {inv} recover ") == ["ct200", "ct201", "cx300"]
    assert complete(f"gpubox -i {inv} doctor ct") == ["ct200", "ct201"]
    assert complete(f"gpubox -i {inv} tune pcie c") == ["ct200", "ct201", "cx300"]
    assert complete(f"gpubox -i {inv} schedule install cx") == ["cx300"]
    # Proxmox hosts are not boxes; the inventory also comes from $GPUBOX_INVENTORY.
    assert complete("gpubox doctor ", {"GPUBOX_INVENTORY": str(inv)}) == ["ct200", "ct201", "cx300"]


def test_unreadable_inventory_completes_nothing_quietly(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("all: [unclosed\n")
    assert complete(f"gpubox -i {bad} recover ") == []
    assert complete(f"gpubox -i {tmp_path}/missing.yml recover ") == []


def test_bash_source_script():
    env = dict(os.environ, _GPUBOX_COMPLETE="bash_source")
    p = subprocess.run(
        [sys.executable, "-m", "gpubox.cli"], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and "complete -o nosort -F" in p.stdout and "_GPUBOX_COMPLETE" in p.stdout
