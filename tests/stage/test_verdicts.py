"""The cold probe's kept verdicts (verdicts.py)."""

import json
import os
import subprocess
import sys
import time

from gpubox.provision import stage as st
from gpubox.provision.stage import probe, sizes, verdicts
from tests.pagecache import evict
from tests.stage.kit import _cold_src, _files, _stage


def test_probe_verdict_is_remembered_per_filesystem_and_expires(tmp_path, monkeypatch):
    """The next cold run on the same filesystem takes the probe's verdict from the state directory
    and probes nothing; an expired verdict (or none kept) means a probe again."""
    monkeypatch.setattr(sizes, "CHUNK", 256 << 10)
    monkeypatch.setattr(probe, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(probe, "COLD_THREADS", 2)
    src = _cold_src(tmp_path, seed=30)
    probes = []
    real = st.Copier._probe
    monkeypatch.setattr(st.Copier, "_probe", lambda self, *a: probes.append(1) or real(self, *a))
    evict(src)
    first = _stage(src, tmp_path / "d1")["read"]
    assert probes == [1] and "probed_at" not in first
    saved = json.loads((tmp_path / "state" / st.VERDICTS).read_text())
    ((key, entry),) = saved.items()
    assert key == verdicts.fs_key(str(src), 2) and entry["mode"] == first["mode"]
    evict(src)
    second = _stage(src, tmp_path / "d2")
    assert probes == [1]  # not probed again
    assert second["read"]["mode"] == first["mode"] and second["read"]["probed_at"] == entry["at"]
    for rel in _files(src):
        assert (tmp_path / "d2" / rel).read_bytes() == (src / rel).read_bytes()
    entry["at"] -= 8 * 86400  # older than VERDICT_DAYS (7)
    (tmp_path / "state" / st.VERDICTS).write_text(json.dumps({key: entry}))
    evict(src)
    third = _stage(src, tmp_path / "d3")["read"]
    assert probes == [1, 1] and "probed_at" not in third
    monkeypatch.setenv("GPUBOX_STAGE_STATE_DIR", "")  # keep none: every cold run probes
    evict(src)
    _stage(src, tmp_path / "d4")
    evict(src)
    _stage(src, tmp_path / "d5")
    assert probes == [1, 1, 1, 1]


def test_remembering_a_verdict_removes_a_killed_runs_temp(tmp_path, monkeypatch):
    """A run killed between the temp and the rename leaves VERDICTS.<pid>.tmp, a name no later run
    would reuse: the next save removes it (its pid is gone), and keeps a live process's temp."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("GPUBOX_STAGE_STATE_DIR", str(state))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs (reaped)
    left = state / f"{st.VERDICTS}.{dead.pid}.tmp"
    live = state / f"{st.VERDICTS}.{os.getppid()}.tmp"
    other = state / "notes.tmp"
    for p in (left, live, other):
        p.write_text("{")
    verdicts.remember(str(tmp_path), 2, "buffered", {"direct": 1.0, "buffered": 1.2})
    assert not left.exists() and live.exists() and other.exists()
    assert (
        json.loads((state / st.VERDICTS).read_text())[verdicts.fs_key(str(tmp_path), 2)]["mode"] == "buffered"
    )


def test_a_kept_verdict_is_judged_again_by_todays_margin(tmp_path, monkeypatch):
    """A verdict kept by an older version (O_DIRECT taken at 1.32x buffered in its probe, as on the
    16-core device VM, where that read the disk at 0.72 of its rate) is judged again from its kept
    rates: buffered reads, no probe; a kept verdict whose rates cannot be read keeps its mode."""
    monkeypatch.setattr(sizes, "CHUNK", 256 << 10)
    monkeypatch.setattr(probe, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(probe, "COLD_THREADS", 2)
    src = _cold_src(tmp_path, seed=31)
    probes = []
    monkeypatch.setattr(st.Copier, "_probe", lambda self, *a: probes.append(1) or {})
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    key = verdicts.fs_key(str(src), 2)

    def keep(rates):
        entry = {"mode": "direct", "probe_gb_s": rates, "at": int(time.time())}
        (state / st.VERDICTS).write_text(json.dumps({key: entry}))

    keep({"direct": 1.574, "buffered": 1.191})
    evict(src)
    out = _stage(src, tmp_path / "d1")
    assert probes == [] and out["read"]["mode"] == "buffered" and out["read_direct_bytes"] == 0
    keep({"direct": "fast", "buffered": None})
    evict(src)
    out = _stage(src, tmp_path / "d2")
    assert probes == [] and out["read"]["mode"] == "direct" and out["read_direct_bytes"] > 0
    for rel in _files(src):
        assert (tmp_path / "d1" / rel).read_bytes() == (src / rel).read_bytes()
        assert (tmp_path / "d2" / rel).read_bytes() == (src / rel).read_bytes()
