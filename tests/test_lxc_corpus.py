"""gpubox's start and access model (provision/lxcmodel.py) against the real kernel: every corpus entry
(tests/fixtures/lxc/corpus, recorded from real LXC containers by tests/lxc_corpus.py) must agree on
whether the container starts and on the verdict of every node the container probed. Where real LXC
can run here, a sample is started again and must still give the recorded answers."""

from __future__ import annotations

import os

import pytest

from gpubox.provision.lxcconf import LxcConf
from gpubox.provision.lxcmodel import StartModel, host_exists_under, host_mode_under, host_rdev_under
from gpubox.simbox import lxcreal
from tests import lxc_corpus

ENTRIES = lxc_corpus.load()
# CI re-runs these against real LXC (one per class the model got wrong before; a few seconds).
SAMPLE = (
    "matrix/only_195",
    "matrix/unpriv_stale_uvm",
    "matrix/deny_a_last",
    "matrix/two_spaces",
    "matrix/a_star_rwm",
    "matrix/devn_deny_write",
    "matrix/uvm_missing_optional",
    "fixed/telmate_1138_nvidia_coral_dri",
)


def _model(entry: dict, root) -> StartModel:
    lxc_corpus.host_from(entry["host"], root)
    conf = LxcConf.parse(entry["config"])
    entries = [(i, l.key, (l.value or "").strip()) for i, l in enumerate(conf.main.lines) if l.key]
    r = str(root)
    return StartModel.build(entries, host_rdev_under(r), host_exists_under(r), host_mode_under(r))


def _compared(model: StartModel, path: str) -> bool:
    """Paths the model speaks for: under /dev, or provided by a mount entry / devN (a path such as
    /sys/kernel/security exists in the container for reasons that are no device's)."""
    return path.startswith("/dev/") or model.node(path)[0] != "absent"


def test_corpus_covers_every_real_config_and_the_matrix():
    names = {e["name"] for e in ENTRIES}
    real = sorted(p.stem for p in lxc_corpus.REAL.glob("*.conf"))
    assert len(real) >= 20
    for stem in real:
        assert f"realworld/{stem}" in names and f"fixed/{stem}" in names
    assert {f"matrix/{k}" for k in lxc_corpus.MATRIX} <= names
    for e in ENTRIES:
        assert e["recorded"]["command"].startswith(lxc_corpus.RECORD_CMD)
        assert e["recorded"]["runtime"].startswith("lxc ")


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_model_agrees_with_the_real_kernel(entry, tmp_path):
    model = _model(entry, tmp_path / "host")
    real = entry["real"]
    assert model.starts == real["starts"], (model.errors, real["error"])
    if not real["starts"]:
        return
    got = {p: model.verdict(p) for p in real["nodes"] if _compared(model, p)}
    want = {p: v for p, v in real["nodes"].items() if p in got}
    assert got == want


@pytest.mark.parametrize(
    "entry", [e for e in ENTRIES if e["name"].startswith("fixed/")], ids=lambda e: e["name"]
)
def test_after_the_fix_every_nvidia_node_opens_for_real(entry):
    """`gpubox lxc fix`'s result, started for real: it starts and every NVIDIA node it passes is
    read-write; only file modes (nvidia-caps 0400/0444 in an unprivileged CT) may refuse first, and
    an optional node (modeset, caps) a devN config does not pass is absent: the fix makes no devN
    entry for a node no boot creates (it would stop the start on a boot without it)."""
    real = entry["real"]
    assert real["starts"], real["error"]  # (openwrt: its phys NICs are dropped, see lxcreal.DROPPED)
    optional = lambda p: p == "/dev/nvidia-modeset" or p.startswith("/dev/nvidia-caps/")  # noqa: E731
    for p, v in real["nodes"].items():
        if p.startswith("/dev/nvidia"):
            assert (
                v in ("rw", "dir") or (v == "mode" and "nvidia-caps/" in p) or (v == "absent" and optional(p))
            ), (
                p,
                v,
            )


def _runtime():
    rt = lxcreal.runtime()
    if not rt.real:
        if os.environ.get("GPUBOX_REQUIRE_REAL_LXC"):
            pytest.fail(f"real LXC required but not usable: {rt.reason}")
        pytest.skip(f"no real LXC here ({rt.reason}): the recorded answers stand")
    return rt


@pytest.fixture
def open_tmp():
    """A temp dir every path component of which an unprivileged CT's root (uid 100000) can walk:
    pytest's own tmp_path sits under a 0700 directory, where the bind mounts would fail."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="gpubox-corpus-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_sample_still_gives_the_recorded_answers(open_tmp):
    from pathlib import Path

    rt = _runtime()
    by_name = {e["name"]: e for e in ENTRIES}
    specs = []
    for i, name in enumerate(SAMPLE):
        root = lxc_corpus.host_from(by_name[name]["host"], Path(open_tmp) / f"h{i}")
        specs.append(lxcreal.Spec(by_name[name]["config"], str(root)))
    answers = lxcreal.run(specs, rt)
    for name, ans in zip(SAMPLE, answers):
        rec = by_name[name]["real"]
        assert ans["starts"] == rec["starts"], (name, ans["error"])
        assert {p: n["verdict"] for p, n in ans["nodes"].items()} == rec["nodes"], name
    import tempfile

    mine = [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"gpubox-lxc-{os.getpid()}-")]
    assert mine == []


def test_a_killed_batch_leaves_nothing_the_next_run_does_not_clean(tmp_path):
    _runtime()
    import tempfile

    dead = tempfile.mkdtemp(prefix="gpubox-lxc-999999999-")  # a pid no process has
    (tmp_path / "x").write_text("")
    os.makedirs(os.path.join(dead, "gpubox-999999999-0", "rootfs"))
    assert dead in lxcreal.clean_stale()
    assert not os.path.exists(dead)


# -- mounts judged as LXC does (the real answers: matrix/plain_file_sources, relative_source*,
#    uvm_missing_optional) -----------------------------------------------------------------------


def test_plain_file_source_exists_and_relative_source_is_no_traceback(tmp_path):
    from gpubox.provision.confedit import decide
    from gpubox.provision.container_config_step import _exists, _lookup
    from gpubox.provision.devices import read_host_devices
    from gpubox.provision.lxc import HostRdev, referenced_paths
    from tests.lxc_fakehost import fake_host

    root = tmp_path / "pve1"
    h = fake_host(root)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_bytes(b"\x7fELF")
    text = (
        "arch: amd64\n"
        + lxc_corpus.GOOD
        + lxc_corpus.NV_MOUNTS.replace("nvidia1", "nvidia0")
        + "lxc.mount.entry: /usr/bin/nvidia-smi usr/bin/nvidia-smi none bind,create=file\n"
        + "lxc.mount.entry: dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file\n"
    )
    hd = read_host_devices(h, 1)
    facts = HostRdev.read(h, tuple(referenced_paths(text, hd)))
    assert facts["/usr/bin/nvidia-smi"] == "file" and facts["dev/nvidia-modeset"] is None
    rev = decide(LxcConf.parse(text), hd, None, _lookup(facts), frozenset(), _exists(facts))
    assert not [i for i in rev.issues if i.kind == "would-not-start"], rev.issues
    # the model says what the real start did: a relative source without `optional` fails it
    entries = [(0, "lxc.mount.entry", "dev/nvidia-modeset dev/nvidia-modeset none bind,create=file")]
    model = StartModel.build(entries, _lookup(facts), _exists(facts))
    assert not model.starts and 'Failed to mount "dev/nvidia-modeset"' in model.errors[0]


def test_an_empty_file_where_a_node_should_be_is_named(tmp_path):
    from gpubox.provision import cuda_probe

    f = tmp_path / "nvidia-uvm"
    f.write_bytes(b"")
    assert cuda_probe._errname(cuda_probe.real_open(str(f))) == "NOTDEV"
    found = cuda_probe.decide({"nodes": {"/dev/nvidia-uvm": "NOTDEV"}, "cuinit": 999}, "ct200")
    cause, repair = next((c, r) for code, c, r in found if code == "not-a-device")
    assert "host node was missing when the container started" in cause
    assert repair.startswith("restart it after host-devices")


def test_the_simulated_box_container_is_a_real_lxc_container(tmp_path, monkeypatch):
    """`pct start` of the simulated box starts the config for real where it can: the stale uvm
    rule's EPERM then comes from the kernel, and the runtime is named; GPUBOX_LXC=sim forces the
    simulation (and says so)."""
    from gpubox.simbox import build

    rt = _runtime()
    sim = build(tmp_path / "box", ["uvm_stale_major"], gpus=1)
    ct = sim.read_state()["containers"]["200"]
    assert ct["runtime"] == rt.name
    assert ct["real_nodes"]["/dev/nvidia-uvm"][0] == "denied" and ct["real_nodes"]["/dev/nvidia0"][0] == "rw"
    monkeypatch.setenv(lxcreal.ENV_FORCE, "sim")
    sim2 = build(tmp_path / "box2", ["uvm_stale_major"], gpus=1)
    ct2 = sim2.read_state()["containers"]["200"]
    assert ct2["runtime"] == "simulation" and ct2["real_nodes"] == {}


def _our_cgroups(hybrid: bool) -> list[str]:
    """LXC's cgroups of our containers in the cgroup2 hierarchy (seen from a private namespace on a
    hybrid host, where the host itself has no cgroup2 mount)."""
    import subprocess

    ls = "ls /sys/fs/cgroup"
    if hybrid:
        ls = "umount -R /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && " + ls
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", ls], capture_output=True, text=True
    ).stdout
    return [n for n in out.split() if "gpubox-" in n]


def test_a_batch_killed_mid_start_is_cleaned_by_the_next_run(open_tmp):
    """SIGKILL to a whole batch (unshare, lxc-start, the containers): its lxcpath and cgroups are
    left; the next batch removes them before it starts its own."""
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    rt = _runtime()
    entry = next(e for e in ENTRIES if e["name"] == "matrix/only_195")
    root = lxc_corpus.host_from(entry["host"], Path(open_tmp) / "h")
    code = (
        "from gpubox.simbox import lxcreal; import sys; "
        f"lxcreal.run([lxcreal.Spec(sys.stdin.read(), {str(root)!r})] * 20)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, start_new_session=True, text=True
    )
    p.stdin.write(entry["config"])
    p.stdin.close()
    tmp = Path(tempfile.gettempdir())
    deadline = time.monotonic() + 60
    while not list(tmp.glob(f"gpubox-lxc-{p.pid}-*/gpubox-{p.pid}-3")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert list(tmp.glob(f"gpubox-lxc-{p.pid}-*")), "the batch was killed before it left anything"
    ans = lxcreal.run([lxcreal.Spec(entry["config"], str(root))], rt)
    assert ans[0]["starts"]
    assert not list(tmp.glob(f"gpubox-lxc-{p.pid}-*"))
    assert not [c for c in _our_cgroups(rt.hybrid) if f"gpubox-{p.pid}-" in c]


def test_a_machine_that_cannot_start_a_container_gets_the_simulation_and_says_why(monkeypatch):
    monkeypatch.setattr(lxcreal, "_RUNTIME", None)
    monkeypatch.setattr(lxcreal, "detect", lambda: lxcreal.Runtime(True, "lxc 5.0.2 (test)"))
    err = ["ERROR    start - ../src/lxc/start.c:__lxc_start:2107 - Failed to spawn container"]
    monkeypatch.setattr(lxcreal, "run", lambda specs, rt=None: [{"starts": False, "error": err}])
    rt = lxcreal.runtime()
    assert not rt.real and rt.name == "simulation" and "Failed to spawn container" in rt.reason


def test_the_cgroup_mount_is_replaced_only_on_a_hybrid_host():
    """A cgroup2-only /sys/fs/cgroup (the H200 machine's line, as recorded) is used as it is: a new
    mount there would clear nsdelegate machine-wide; a tmpfs with v1 controllers (CI) is replaced
    in a private namespace."""
    from tests.test_lxc_gpu_record import DOC

    assert lxcreal.cgroup_layout("\n".join(DOC["cgroup_mount"])) == "cgroup2"
    hybrid = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    )
    assert lxcreal.cgroup_layout(hybrid) == "hybrid"
    assert lxcreal.cgroup_layout("22 1 0:5 / /proc rw - proc proc rw\n") == "none"
