"""shm-room: which container config lines size /dev/shm from the host (provision.shmroom.host_mount),
and NCCL's room scaling with the ranks on the node (none for one rank)."""

import pytest

from gpubox.provision.shmroom import GIB, ShmFacts, decide, host_mount, mount_size, need_bytes

ENTRY = "tmpfs dev/shm tmpfs size=512M,nosuid,nodev,create=dir 0 0"


@pytest.mark.parametrize(
    "conf, want",
    [
        (f"arch: amd64\nlxc.mount.entry: {ENTRY}\n", ENTRY),
        # `key = value`, an absolute target and another source name: LXC takes them all
        ("lxc.mount.entry = none /dev/shm tmpfs size=2G 0 0\n", "none /dev/shm tmpfs size=2G 0 0"),
        # a trailing comment is not part of the options
        (f"lxc.mount.entry: {ENTRY} # bigger shm\n", ENTRY),
        # only the main section counts: a snapshot's line is not what the container starts with
        (f"arch: amd64\n[before-upgrade]\nlxc.mount.entry: {ENTRY}\n", None),
        # a bind mount of the host's /dev/shm is not a tmpfs sized here
        ("lxc.mount.entry: /dev/shm dev/shm none bind,create=dir 0 0\n", None),
        # another tmpfs (dev/shm/x, a cache dir) is not /dev/shm
        ("lxc.mount.entry: tmpfs tmp/cache tmpfs size=1G 0 0\n", None),
        ("", None),
    ],
)
def test_host_mount(conf, want):
    assert host_mount(conf) == want


def test_mount_size_reads_the_last_size_option():
    assert mount_size(ENTRY) == "512M"
    assert mount_size("tmpfs dev/shm tmpfs size=1G,size=4G 0 0") == "4G"
    assert mount_size("tmpfs dev/shm tmpfs nosuid 0 0") is None


@pytest.mark.parametrize("ranks", [1, 2, 4, 8, 16])
def test_room_scales_with_ranks_and_one_rank_needs_none(ranks):
    need = need_bytes(ranks)
    assert need == (0 if ranks == 1 else ranks * GIB // 8)
    just_below = ShmFacts(size=64 * GIB, free=max(need - 1, 0))
    status = decide(just_below, ranks)[0]
    assert status == ("ok" if ranks == 1 else "failed")
    assert decide(ShmFacts(size=64 * GIB, free=need), ranks)[0] == "ok"


def test_on_a_simulated_box_one_gpu_needs_no_room_and_the_ct_config_is_read(tmp_path):
    """The step end to end on a 1-GPU simulated box: no NCCL room demanded; the tmpfs line the host's
    CT config mounts at dev/shm is read into the facts (through pmxcfs, where the config lives)."""
    import yaml

    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.pipeline import run_steps
    from gpubox.provision.shm_room_step import ShmRoomStep
    from gpubox.simbox import build

    sim = build(tmp_path / "box", (), gpus=1)
    inv_doc = yaml.safe_load(sim.inventory_path.read_text())
    inv_doc["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_bench"]["tp"] = [1]
    sim.inventory_path.write_text(yaml.safe_dump(inv_doc))
    conf = sim.hpath("/etc/pve/lxc/200.conf")
    conf.write_text(conf.read_text().replace("\n", f"\nlxc.mount.entry: {ENTRY}\n", 1))
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box("ct200"), inventory=inv)
    step = ShmRoomStep()
    facts = step.gather(ctx)
    assert facts.host_mount == ENTRY
    rep = run_steps(ctx, [step], "check")
    assert (
        rep.steps[0].status == "ok" and "1 GPU, NCCL makes no shared-memory segments" in rep.steps[0].detail
    )
