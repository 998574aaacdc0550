"""The work-stealing schedule (schedule.py): each range once, in contiguous spans; one large file split
across workers into one partial, its writers taking turns."""

import json
import os

import pytest
import xxhash

from gpubox.provision import stage as st
from gpubox.provision.stage import copier, readers, schedule, sizes
from tests.stage.kit import _big_model, _stage


def test_one_large_file_is_split_across_workers_into_one_partial(tmp_path, monkeypatch):
    """With more workers than files, the ranges of one shard go to several workers, each pwrite()ing
    into the same NAME.partial: the copy is exact and its range digests are the source's."""
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    src = tmp_path / "s"
    shard = _big_model(src, seed=21)
    writers: dict[int, set] = {}
    real = copier.chunk

    def spy(sfd, dfd, start, end, *a, **kw):
        if dfd is not None and end - start == sizes.CHUNK:
            writers.setdefault(os.fstat(dfd).st_ino, set()).add(__import__("threading").get_ident())
        return real(sfd, dfd, start, end, *a, **kw)

    monkeypatch.setattr(copier, "chunk", spy)
    out = _stage(src, tmp_path / "d", workers=4)
    assert (tmp_path / "d" / shard.name).read_bytes() == shard.read_bytes()
    assert max(len(t) for t in writers.values()) > 1  # several threads wrote the one shard
    entry = json.loads((tmp_path / "d" / st.MANIFEST).read_text())["files"][shard.name]
    data = shard.read_bytes()
    assert entry["ranges"] == [
        xxhash.xxh3_64(data[i : i + sizes.CHUNK]).digest().hex() for i in range(0, len(data), sizes.CHUNK)
    ]
    assert out["copied_bytes"] == sum(p.stat().st_size for p in src.iterdir())


def _takes(jobs: list, workers: int) -> list[list[tuple[str, int | None]]]:
    """Each worker's ranges, in the order _Schedule hands them out when workers take in turn."""
    sched, spans = schedule.Schedule(jobs), [None] * workers
    got: list[list] = [[] for _ in range(workers)]
    live = set(range(workers))
    while live:
        for w in sorted(live):
            t = sched.take(spans[w])
            if t is None:
                live.discard(w)
                continue
            spans[w], i = t
            got[w].append((spans[w].job.rel, i))
    return got


@pytest.mark.parametrize("workers", [1, 3, 5, 8, 13])
def test_schedule_hands_each_range_once_in_contiguous_spans(tmp_path, workers):
    """Every range is copied once; a worker reads one contiguous stretch of a file at a time (its
    readahead carries over), and with more workers than files the big shard is split among them,
    while a whole-file (hub sha256) job stays with one worker."""
    nranges = {"a": 17, "b": 5, "c": 1, "hub": 4}
    jobs = [
        schedule.FileJob(
            str(tmp_path),
            str(tmp_path),
            r,
            {"size": n * sizes.CHUNK, "hub_sha256": "x" if r == "hub" else ""},
        )
        for r, n in nranges.items()
    ]
    got = _takes(jobs, workers)
    handed = sorted((r, i) for w in got for r, i in w if i is not None)
    assert handed == sorted((r, i) for r, n in nranges.items() if r != "hub" for i in range(n))
    assert sum(1 for w in got for r, i in w if r == "hub") == 1
    # a stretch goes on while a worker's next range is the one after its last in the same file;
    # each worker starts at most one beyond the files' own (by stealing), where ranges handed out
    # in turn would start one per range (23 of them)
    stretches = sum(
        1 for w in got for k, (r, i) in enumerate(w) if k == 0 or i is None or w[k - 1] != (r, i - 1)
    )
    assert stretches <= len(nranges) + workers
    if workers >= 5:
        assert len({id(w) for w in got if any(r == "a" for r, _ in w)}) > 1


def test_writers_of_one_file_take_turns(tmp_path, monkeypatch):
    """Several workers on one shard never pwrite into it at the same time: a second writer waits
    on the file's lock (asleep) instead of spinning on tmpfs's inode lock."""
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    monkeypatch.setattr(sizes, "BUF", 32 << 10)
    src = tmp_path / "s"
    shard = _big_model(src, seed=24)
    inside: dict[int, int] = {}
    most = [0]
    guard = __import__("threading").Lock()
    real = readers._write

    def write(dfd, view, off):
        ino = os.fstat(dfd).st_ino
        with guard:
            inside[ino] = inside.get(ino, 0) + 1
            most[0] = max(most[0], inside[ino])
        try:
            __import__("time").sleep(0.0005)  # a write long enough for another writer to arrive
            return real(dfd, view, off)
        finally:
            with guard:
                inside[ino] -= 1

    monkeypatch.setattr(readers, "_write", write)
    _stage(src, tmp_path / "d", workers=4)
    assert (tmp_path / "d" / shard.name).read_bytes() == shard.read_bytes()
    assert most[0] == 1
