"""benchmarks/tmpfs_fill.py (the tmpfs's fill ceilings) and how benchmarks/stage_vs_cp.py bounds
each layout with them: every case runs and cleans up, the shard and copy cases write where and
what they say, and a copy is never bounded by a case that skips the allocation it cannot skip."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return mod


fill = _load("tmpfs_fill")


def test_every_case_runs_and_cleans_up_and_k_files_get_their_share(tmp_path, monkeypatch):
    """Each case runs (two 1 MiB ranges, 2 threads, 2 files), gives a rate, and removes its files;
    the K-file case writes each file its share of the ranges."""
    monkeypatch.setattr(fill, "RANGE", 1 << 20)
    out = fill.measure(str(tmp_path), 2 * (1 << 20) / 1e9, 2, rounds=1, files=2)
    assert set(out) >= {
        "memory, fresh pages",
        "tmpfs pwrite, a file each",
        "tmpfs pwrite, 2 files",
        "tmpfs 2 files, pwrite + faults",
        "tmpfs mapped, fallocate whole",
        "tmpfs mapped, copy only (allocated)",
    }
    assert all(v > 0 for v in out.values())
    assert list(tmp_path.iterdir()) == []
    f = fill.Fill(str(tmp_path), 4 << 20, 2, files=2)
    sizes = []
    real = f._drop

    def drop(fd, path):
        sizes.append(Path(path).stat().st_size)
        real(fd, path)

    f._drop = drop
    f.pwrite_files(2)
    f.close()
    assert sizes == [2 << 20, 2 << 20]  # four ranges into two files, two each


def test_the_copy_cases_write_the_source_bytes(tmp_path, monkeypatch):
    """With a source, the "copy:" cases read it on the way: each file they write holds the
    source's bytes (at the same offsets), by the mapping and by pwrite alike."""
    import os

    monkeypatch.setattr(fill, "RANGE", 1 << 20)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(4 << 20))
    out_dir = tmp_path / "fill"
    out_dir.mkdir()
    f = fill.Fill(str(out_dir), 4 << 20, 2, files=2, source=str(src))
    seen = {}
    real = f._drop

    def drop(fd, path):
        seen[Path(path).name] = Path(path).read_bytes()
        real(fd, path)

    f._drop = drop
    cases = f.copy_cases()
    assert set(cases) == {*fill.COPY_ONE_FILE, fill.COPY_EACH, fill.k_files(2)[2]}
    cases["copy: one file, fallocate + mapping + 1 pwrite"]()
    assert seen.pop("mapped") == src.read_bytes()
    cases["copy: one file, pwrite"]()
    assert seen.pop("one") == src.read_bytes()
    cases["copy: 2 files, pread + pwrite"]()
    data = src.read_bytes()
    mb = 1 << 20  # range r goes to file r % 2 at (r // 2) MiB
    assert seen["k-0"] == data[0:mb] + data[2 * mb : 3 * mb]
    assert seen["k-1"] == data[mb : 2 * mb] + data[3 * mb : 4 * mb]
    assert not f.copying
    f.close()
    one = fill.Fill(str(out_dir), 4 << 20, 1, source=str(src))  # one thread: one file holds it all
    one._drop = drop
    one.copy_cases()[fill.COPY_EACH]()
    assert seen.pop("each-0") == data
    one.close()
    assert list(out_dir.iterdir()) == []


def test_a_copy_is_bounded_by_ways_that_allocate():
    """One big file: the bound is the best fill that allocates the file's pages (never "copy
    only", which fills pages allocated before the clock, nor the bare fallocate); shards: pwrite
    into that many files (and with faulting writers beside), and a file per thread. The goal is
    shown as a share of each bound."""
    sv = _load("stage_vs_cp")
    ceil = {
        "memory, touched": 60.0,
        "tmpfs pwrite, a file each": 30.0,
        "tmpfs pwrite, one file": 2.7,
        "tmpfs fallocate, one call": 9.4,
        "tmpfs mapped, fallocate whole": 6.4,
        "tmpfs mapped, faults allocate": 4.6,
        "tmpfs mapped, copy only (allocated)": 23.8,
        "tmpfs mapped + 1 pwrite, copy only": 24.9,
    }
    res = {
        "warm": {"cp -r": {"gb_s": 2.0}, "xargs -P16 cp": {"gb_s": 2.2}, "gpubox xxh3": {"gb_s": 4.8}},
        "ratios": {},
    }
    sv.add_fill(
        res, ceil, {"copy: one file, fallocate + mapping + 1 pwrite": 5.5, "copy: one file, pwrite": 2.4}
    )
    assert res["fill_bound_gb_s"] == {
        "one file, the best way": 6.4,
        "a copy into one file, the best way": 5.5,
    }
    assert res["ratios"]["warm: gpubox xxh3 rate / bound (one file, the best way, 6.40 GB/s)"] == 0.75
    assert res["ratios"][
        "warm: 2.5x cp -r's rate / bound (one file, the best way; above 1: beyond this machine)"
    ] == round(5 / 6.4, 3)
    res = {"warm": {"xargs -P16 cp": {"gb_s": 12.0}, "gpubox xxh3": {"gb_s": 11.0}}, "ratios": {}}
    sv.add_fill(
        res,
        ceil,
        {
            "tmpfs pwrite, 8 files": 20.0,
            "tmpfs 8 files, pwrite + faults": 24.0,
            "copy: 8 files, pread + pwrite": 15.0,
            "copy: a file each, pread + pwrite": 22.0,
        },
    )
    assert res["fill_bound_gb_s"] == {
        "pwrite, a file per thread": 30.0,
        "pwrite, 8 files": 20.0,
        "8 files, pwrite + faults": 24.0,
        "copy: 8 files, pread + pwrite": 15.0,
        "copy: a file each, pread + pwrite": 22.0,
    }
    assert (
        res["ratios"][
            "warm: 1.5x xargs -P16 cp's rate / bound (pwrite, 8 files; above 1: beyond this machine)"
        ]
        == 0.9
    )
