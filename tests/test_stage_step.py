"""The model-stage / drafter-stage steps and `gpubox stage` on the simulated box (and over real SSH)."""

import hashlib
import json
import os

import yaml

from gpubox.context import Context
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.provision import stage as engine
from gpubox.provision.stage_step import steps
from gpubox.simbox import build
from gpubox.simbox.model import DRAFTER_DEST, MODEL_DEST, MODEL_SRC, make_model
from tests.clirun import gpubox
from tests.sshd import container_over_ssh


def _ctx(sim, **opts):
    inv = Inventory(sim.inventory_path)
    return Context(box=inv.box(sim.box), inventory=inv, options=opts)


def _by_name(report):
    return {s.name: s for s in report.steps}


def test_healthy_box_is_staged(tmp_path):
    sim = build(tmp_path / "box")
    rep = run_steps(_ctx(sim), steps(_ctx(sim)), "check")
    assert [(s.name, s.status) for s in rep.steps] == [("model-stage", "ok"), ("drafter-stage", "ok")]
    assert _by_name(rep)["model-stage"].detail == f"{MODEL_DEST}: staged, 8 files, 3.1 MB"
    assert rep.ok


def test_shm_empty_found_then_restaged_then_nothing_to_do(tmp_path):
    sim = build(tmp_path / "box", ["shm_empty"])
    assert not sim.cpath(MODEL_DEST).exists()
    ctx = _ctx(sim)
    rep = run_steps(ctx, steps(ctx), "check")
    for s in rep.steps:
        assert s.status == "drift" and "manifest absent: not staged" in s.detail
        assert s.cause == "tmpfs is empty after a reboot, or a copy was interrupted"
    plan = run_steps(ctx, steps(ctx), "plan")
    assert not sim.cpath(MODEL_DEST).exists()  # a dry run writes nothing
    m = _by_name(plan)["model-stage"]
    assert m.commands == [["gpubox", "stage", MODEL_SRC, MODEL_DEST]]
    assert "+ model-00001-of-00003.safetensors  (before: not staged)" in m.diff
    rep = run_steps(ctx, steps(ctx), "apply")
    assert [s.status for s in rep.steps] == ["fixed", "fixed"] and rep.ok
    assert (sim.cpath(MODEL_DEST) / engine.MANIFEST).exists()
    assert (sim.cpath(DRAFTER_DEST) / "model.safetensors").exists()
    again = run_steps(ctx, steps(ctx), "apply")
    assert [s.status for s in again.steps] == ["ok", "ok"] and not again.changed


def test_truncated_shard_found_by_model_stage_only(tmp_path):
    sim = build(tmp_path / "box", ["truncated_shard"])
    rep = run_steps(_ctx(sim), steps(_ctx(sim)), "check")
    st = _by_name(rep)
    assert st["drafter-stage"].status == "ok"
    assert st["model-stage"].status == "drift"
    assert "model-00002-of-00003.safetensors" in st["model-stage"].detail
    assert any("truncated" in p for p in st["model-stage"].evidence["problems"])


def test_cli_repairs_truncated_shard(tmp_path, capsys):
    sim = build(tmp_path / "box", ["truncated_shard"])
    code, out, err = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--json")
    assert code == 0, err
    doc = json.loads(out)
    st = {s["name"]: s for s in doc["steps"]}
    assert st["model-stage"]["status"] == "fixed" and st["drafter-stage"]["status"] == "ok"
    [summary] = doc["staged"]
    assert summary["copied"] == 1 and summary["skipped"] == 7 and summary["copied_bytes"] == 1_198_216
    shard = "model-00002-of-00003.safetensors"
    assert (sim.cpath(MODEL_DEST) / shard).read_bytes() == (sim.cpath(MODEL_SRC) / shard).read_bytes()
    code, out, _ = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--verify", "--json")
    doc = json.loads(out)
    assert code == 0 and not doc["changed"]
    assert doc["steps"][0]["detail"].endswith("8 hashes verified")


def test_cli_verify_finds_and_repairs_corrupted_byte(tmp_path, capsys):
    sim = build(tmp_path / "box")
    shard = sim.cpath(DRAFTER_DEST) / "model.safetensors"
    s0 = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x40
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(s0.st_atime_ns, s0.st_mtime_ns))
    code, out, _ = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--dry-run", "--json")
    assert code == 0  # stat + headers cannot see a flipped byte
    code, out, _ = gpubox(
        capsys, "-i", sim.inventory_path, "stage", sim.box, "--dry-run", "--verify", "--json"
    )
    d = {s["name"]: s for s in json.loads(out)["steps"]}["drafter-stage"]
    assert code == 1 and d["status"] == "drift"
    assert "hash mismatch" in d["detail"] and d["cause"] == "the staged copy was damaged or modified"
    code, out, _ = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--verify", "--json")
    assert (
        code == 0 and {s["name"]: s["status"] for s in json.loads(out)["steps"]}["drafter-stage"] == "fixed"
    )


def test_container_memory_limit_refuses_then_force(tmp_path, capsys):
    sim = build(tmp_path / "box", ["shm_empty"])
    cg = sim.cpath("/sys/fs/cgroup")
    (cg / "memory.max").write_text(f"{8 << 30}\n")
    (cg / "memory.current").write_text(f"{(8 << 30) - (3 << 30)}\n")
    code, out, err = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--json")
    m = json.loads(out)["steps"][0]
    assert code == 1 and m["status"] == "failed"
    assert (
        "limit 8.6 GB, 5.4 GB in use, 3.2 GB left; staging 3.1 MB would leave 3.2 GB (< 4.3 GB margin)"
        in m["detail"]
    )
    assert "--force" in m["detail"]
    assert not (sim.cpath(MODEL_DEST) / engine.MANIFEST).exists()
    code, out, err = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--force", "--json")
    assert code == 0 and [s["status"] for s in json.loads(out)["steps"]] == ["fixed", "fixed"]


def test_local_copy_cli(tmp_path, capsys):
    src = tmp_path / "M"
    make_model(src, [200_000, 100_000])
    dest = tmp_path / "shm" / "M"
    code, out, _ = gpubox(capsys, "stage", src, dest, "--dry-run", "--json")
    assert code == 1 and len(json.loads(out)["would_copy"]) == 7 and not dest.exists()
    code, out, _ = gpubox(capsys, "stage", src, dest, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["copied"] == 7 and doc["bytes"] == doc["copied_bytes"] > 290_000
    assert set(doc) >= {"bytes", "seconds", "gb_s", "copied", "skipped", "verified"}
    code, out, _ = gpubox(capsys, "stage", src, dest, "--verify", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["copied"] == 0 and doc["verified"] == 7
    code, out, _ = gpubox(capsys, "stage", src, dest, "--dry-run")
    assert code == 0 and "would copy 0 of 7 file(s)" in out
    code, out, err = gpubox(capsys, "stage", tmp_path / "nope", dest)
    assert code == 2 and err.strip().endswith("is not a directory (give the persistent model directory)")


def test_bad_model_setting_is_exit_2(tmp_path, capsys):
    sim = build(tmp_path / "box")
    inv = yaml.safe_load(sim.inventory_path.read_text())
    ct = inv["all"]["children"]["gpu_containers"]["hosts"][sim.box]
    ct["gpubox_model"] = {"dest": "/dev/shm/x"}
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    code, _, err = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box)
    assert code == 2 and "gpubox_model has no source" in err
    ct["gpubox_model"] = {"source": "/mnt/models/x", "dest": "/dev/shm"}
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    code, _, err = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box)
    assert code == 2 and "must be an absolute directory of its own" in err


def test_hf_repo_id_source_from_offline_cache(tmp_path, monkeypatch):
    """source: org/name resolves through huggingface_hub to the cache's snapshot, offline."""
    sim = build(tmp_path / "box", ["shm_empty"])
    plain = tmp_path / "plain"
    make_model(plain, [150_000], name="org/Tiny", seed=9)
    repo = sim.cpath("/mnt/hf/models--org--Tiny")
    rev = "0123456789abcdef0123456789abcdef01234567"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for p in plain.iterdir():
        blob = hashlib.sha256(p.read_bytes()).hexdigest()
        (repo / "blobs" / blob).write_bytes(p.read_bytes())
        (snap / p.name).symlink_to(f"../../blobs/{blob}")
    inv = yaml.safe_load(sim.inventory_path.read_text())
    ct = inv["all"]["children"]["gpu_containers"]["hosts"][sim.box]
    ct["gpubox_model"] = {"source": "org/Tiny", "cache_dir": "/mnt/hf", "offline": True}
    del ct["gpubox_drafter"]
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    ctx = _ctx(sim)
    rep = run_steps(ctx, steps(ctx), "apply")
    [s] = rep.steps
    assert s.status == "fixed", s.detail
    man = json.loads((sim.cpath("/dev/shm/Tiny") / engine.MANIFEST).read_text())
    assert (
        man["source"]["repo"] == "org/Tiny"
        and man["source"]["path"] == f"/mnt/hf/models--org--Tiny/snapshots/{rev}"
    )
    assert (
        man["files"]["model.safetensors"]["sha256"]
        == hashlib.sha256((plain / "model.safetensors").read_bytes()).hexdigest()
    )
    ct["gpubox_model"] = {"source": "org/Absent", "cache_dir": "/mnt/hf", "offline": True}
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    ctx = _ctx(sim)
    [s] = run_steps(ctx, steps(ctx), "check").steps
    assert s.status == "drift" and s.detail == "org/Absent is not in the HF cache yet"


def test_step_over_real_ssh_runs_the_stdlib_copier_remotely(tmp_path, sshd):
    """The container reached over SSH: the copier travels as its payload (`--request JSON`)."""
    sim = build(tmp_path / "box", ["truncated_shard"])
    container_over_ssh(sim.inventory_path, sim.box, sshd)
    ctx = _ctx(sim)
    assert not ctx.container.transport.is_local
    try:
        rep = run_steps(ctx, steps(ctx), "check")
        assert [s.status for s in rep.steps] == ["drift", "ok"]
        rep = run_steps(ctx, steps(ctx), "apply")
        assert [s.status for s in rep.steps] == ["fixed", "ok"], rep.steps[0].detail
        rep = run_steps(ctx, steps(ctx), "check")
        assert rep.ok
    finally:
        ctx.close()
    shard = "model-00002-of-00003.safetensors"
    assert (sim.cpath(MODEL_DEST) / shard).read_bytes() == (sim.cpath(MODEL_SRC) / shard).read_bytes()


def _set_ct(sim, **kv):
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"][sim.box].update(kv)
    sim.inventory_path.write_text(yaml.safe_dump(inv))


def test_hash_sha256_on_request_then_default_keeps_it(tmp_path, capsys):
    sim = build(tmp_path / "box", ["shm_empty"])
    code, out, err = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--hash", "sha256", "--json")
    assert code == 0, err
    assert {s["hash"] for s in json.loads(out)["staged"]} == {"sha256-tree-64MiB"}
    man = json.loads((sim.cpath(MODEL_DEST) / engine.MANIFEST).read_text())
    assert man["hash"] == "sha256-tree-64MiB" and {e["algo"] for e in man["files"].values()} == {
        "sha256-tree-64MiB"
    }
    # the default (xxh3) neither re-stages nor distrusts a sha256-staged directory
    code, out, _ = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box, "--verify", "--json")
    doc = json.loads(out)
    assert code == 0 and not doc["changed"]
    m = doc["steps"][0]
    assert m["detail"].endswith("8 hashes verified") and m["evidence"]["hashes"] == ["sha256-tree-64MiB"]


def test_gpubox_stage_hash_inventory_setting(tmp_path, capsys):
    sim = build(tmp_path / "box", ["shm_empty"])
    _set_ct(sim, gpubox_stage_hash="sha256")
    ctx = _ctx(sim)
    plan = _by_name(run_steps(ctx, steps(ctx), "plan"))["model-stage"]
    assert plan.commands == [["gpubox", "stage", MODEL_SRC, MODEL_DEST, "--hash", "sha256"]]
    run_steps(ctx, steps(ctx), "apply")
    assert json.loads((sim.cpath(DRAFTER_DEST) / engine.MANIFEST).read_text())["hash"] == "sha256-tree-64MiB"
    _set_ct(sim, gpubox_stage_hash="md5")
    code, _, err = gpubox(capsys, "-i", sim.inventory_path, "stage", sim.box)
    assert (
        code == 2
        and "gpubox_stage_hash 'md5' is not a hash the stager knows (use one of: xxh3, crc32, sha256" in err
    )


def test_local_cli_hash_option(tmp_path, capsys):
    src = tmp_path / "M"
    make_model(src, [200_000])
    code, out, _ = gpubox(capsys, "stage", src, tmp_path / "a", "--hash", "sha256", "--json")
    assert code == 0 and json.loads(out)["hash"] == "sha256-tree-64MiB"
    code, out, _ = gpubox(capsys, "stage", src, tmp_path / "b", "--json")
    assert code == 0 and json.loads(out)["hash"] == "xxh3-tree-64MiB"
    code, _, err = gpubox(capsys, "stage", src, tmp_path / "c", "--hash", "md5")
    assert code == 2 and "md5" in err
