"""Hostile but fair inputs to staging (issue 16, items 2, 6 and the staging part of 13).

- a source shard truncated WHILE it is copied, by another process, many times: the stager must end
  with the one-line "source shrank" / "changed during the copy" error (exit 2), never a signal;
- symlinks out of the source are refused by default and named, followed with --follow-links and
  listed; link loops are refused, not walked forever; links inside the source are fine;
- staged files keep the source's permission bits (a 0600 file stays 0600 in tmpfs, whatever the umask);
- a destination that fills up (a real size-limited tmpfs in a private mount namespace) gives an
  error naming the destination and leaves no .partial files behind.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubox.provision import stage as st
from gpubox.simbox.model import make_model
from tests.clirun import gpubox
from tests.pagecache import evict

ROOT = Path(__file__).resolve().parents[2]
ENGINE = [sys.executable, "-m", "gpubox.provision.stage"]  # the copier as its own process
BIG = 96 << 20
SHARD = "model.safetensors"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _partials(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob(f"*{st.PARTIAL}")) if d.exists() else []


# -- 2: the source shrinks mid-copy -------------------------------------------------------------
CUTS = {
    "to zero": lambda n: 0,
    "to one byte": lambda n: 1,
    "to a page": lambda n: 4096,
    "to a third": lambda n: n // 3,
    "to a half": lambda n: n // 2,
    "by one byte": lambda n: n - 1,
    "by a page and 7": lambda n: n - 4096 - 7,
}


@pytest.mark.parametrize("cache", ["warm", "cold"])
@pytest.mark.parametrize("workers", [1, 4])
@pytest.mark.parametrize("cut", list(CUTS))
def test_source_truncated_during_the_copy_is_an_error_never_a_signal(tmp_path, cut, workers, cache):
    """Another process truncates the shard once the stager has written part of it (the .partial
    has grown past 4 MiB): exit 2 with the one-line cause, no signal, nothing half-written left.
    Cold: the source's pages evicted first, so a local filesystem is read with O_DIRECT."""
    src, dest = tmp_path / "src" / "M", tmp_path / "shm" / "M"
    make_model(src, [BIG], seed=3)
    if cache == "cold":
        evict(src)
    shard = src / SHARD
    size = shard.stat().st_size
    p = subprocess.Popen(
        [*ENGINE, str(src), str(dest), "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    partial = dest / (SHARD + st.PARTIAL)
    deadline, cut_at = time.monotonic() + 60, None
    while p.poll() is None and time.monotonic() < deadline:
        try:
            if partial.stat().st_size > (4 << 20):
                cut_at = CUTS[cut](size)
                os.truncate(shard, cut_at)
                break
        except FileNotFoundError:
            pass
        time.sleep(0.0002)
    out, err = p.communicate(timeout=120)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {err[-500:]}"
    assert cut_at is not None, "the copy finished before it could be cut: make BIG larger"
    assert p.returncode == 2, (out, err)
    assert "source shrank while reading" in out or "changed during the copy" in out, out
    assert "Traceback" not in err
    assert _partials(dest) == []
    assert not (dest / st.MANIFEST).exists()


# -- 6: symlinks and permissions --------------------------------------------------------------
@pytest.fixture
def model(tmp_path):
    src = tmp_path / "persistent" / "M"
    make_model(src, [200_000, 100_000], seed=7)
    return src


@pytest.fixture
def secret(tmp_path):
    s = tmp_path / "elsewhere" / "secret.key"
    s.parent.mkdir()
    s.write_bytes(b"not part of any model\n")
    s.chmod(0o600)
    return s


def test_link_out_of_the_source_refused_and_named(model, secret, tmp_path, capsys):
    (model / "extra.key").symlink_to(secret)
    dest = tmp_path / "shm" / "M"
    rc, out, err = gpubox(capsys, "stage", model, dest)
    assert rc == 2
    assert "extra.key" in err and str(secret) in err and "--follow-links" in err
    assert len(err.strip().splitlines()) <= 2, err
    assert not dest.exists()


def test_link_out_of_the_source_followed_on_request_listed_and_private(model, secret, tmp_path, capsys):
    (model / "extra.key").symlink_to(secret)
    dest = tmp_path / "shm" / "M"
    rc, out, err = gpubox(capsys, "stage", model, dest, "--follow-links", "--json")
    assert rc == 0, err
    import json

    doc = json.loads(out)
    assert doc["links_out"] == {"extra.key": str(secret)}
    staged = dest / "extra.key"
    assert not staged.is_symlink() and staged.read_bytes() == secret.read_bytes()
    assert stat.S_IMODE(staged.stat().st_mode) == 0o600  # not the umask's 0644
    # and the text output says so
    shutil.rmtree(dest)
    rc, out, err = gpubox(capsys, "stage", model, dest, "--follow-links")
    assert rc == 0 and f"followed link out of the source: extra.key -> {secret}" in out


def test_links_inside_the_source_are_followed_quietly(model, tmp_path):
    (model / "alias.json").symlink_to("config.json")
    (model / "sub").mkdir()
    (model / "sub" / "up.json").symlink_to("../generation_config.json")
    out = st.stage(str(model), str(tmp_path / "d"), workers=2)
    assert out["links_out"] == {}
    assert (tmp_path / "d" / "alias.json").read_bytes() == (model / "config.json").read_bytes()
    up = (tmp_path / "d" / "sub" / "up.json").read_bytes()
    assert up == (model / "generation_config.json").read_bytes()


@pytest.mark.parametrize("target", ["..", ".", "../.."])
def test_directory_link_loop_refused_not_walked_forever(model, tmp_path, target):
    (model / "loop").symlink_to(target)
    r = subprocess.run(
        [*ENGINE, str(model), str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "reached twice through links" in r.stdout or "links out of it" in r.stdout, r.stdout
    assert not (tmp_path / "d").exists()


def test_dangling_link_refused_with_its_name(model, tmp_path):
    (model / "gone.json").symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(st.StageError, match="gone.json is a broken link"):
        st.stage(str(model), str(tmp_path / "d"), workers=2)


@pytest.mark.parametrize(
    "mode,expect",
    [
        (0o600, 0o600),
        (0o640, 0o640),
        (0o644, 0o644),
        (0o755, 0o755),
        (0o400, 0o400),
        (0o4755, 0o755),
        (0o2770, 0o770),
    ],
)
def test_staged_files_keep_the_source_permissions(model, tmp_path, mode, expect):
    """Permission bits follow the source (set-id bits are dropped: a model file never needs them)."""
    (model / "config.json").chmod(mode)
    old = os.umask(0o022)
    try:
        st.stage(str(model), str(tmp_path / "d"), workers=2)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "d" / "config.json").stat().st_mode) == expect


def test_permissions_loosened_in_the_destination_are_found_and_restored_without_a_copy(model, tmp_path):
    (model / "config.json").chmod(0o600)
    dest = tmp_path / "d"
    st.stage(str(model), str(dest), workers=2)
    (dest / "config.json").chmod(0o644)
    c = st.check(str(model), str(dest))
    assert not c["staged"]
    assert "config.json: mode 0644 in the destination, 0600 in the source" in c["problems"]
    dry = st.stage(str(model), str(dest), workers=2, dry_run=True)
    assert dry["would_chmod"] == ["config.json"]
    assert stat.S_IMODE((dest / "config.json").stat().st_mode) == 0o644  # a dry run changes nothing
    out = st.stage(str(model), str(dest), workers=2)
    assert out["copied"] == 0 and out["modes_fixed"] == ["config.json"]
    assert stat.S_IMODE((dest / "config.json").stat().st_mode) == 0o600
    assert st.check(str(model), str(dest))["staged"]


# -- 13 (staging): the destination fills up ----------------------------------------------------
FULL = r"""
set -e
mount -t tmpfs -o size=6m tmpfs "$1"
"$PY" -m gpubox.cli stage "$2" "$1/M" --force --workers 2 || echo "rc=$?"
ls -a "$1/M" || true
"""


def _unshare_ok() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _unshare_ok(), reason="needs unprivileged user+mount namespaces (unshare -rm)")
def test_full_tmpfs_names_the_destination_and_leaves_no_partial_files(tmp_path):
    """A real 6 MiB tmpfs, mounted in a private user+mount namespace (nothing on the host changes),
    and a 9 MB model: the copy fails on ENOSPC part way."""
    src = tmp_path / "persistent" / "M"
    make_model(src, [3_000_000, 3_000_000, 3_000_000], seed=9)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", FULL, "sh", str(mnt), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), "PY": sys.executable},
    )
    assert "rc=2" in r.stdout, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert f"destination {mnt}/M is full" in err, err
    assert str(src) not in err.split("is full")[0], err  # names the destination, not the source
    assert "Traceback" not in err and len(err.splitlines()) <= 2, err
    listing = r.stdout.split()
    assert not any(n.endswith(st.PARTIAL) for n in listing), listing
    assert st.MANIFEST not in listing


def test_enospc_from_the_kernel_is_reported_for_the_destination_in_process(model, tmp_path, monkeypatch):
    """The same path without namespaces (where unshare is not allowed): pwrite fails with ENOSPC
    after the first MB, as it does on a full tmpfs."""
    import errno

    real, written = os.pwrite, [0]

    def pwrite(fd, data, off):
        if written[0] > (1 << 18):
            raise OSError(errno.ENOSPC, "No space left on device")
        written[0] += len(data)
        return real(fd, data, off)

    monkeypatch.setattr(os, "pwrite", pwrite)
    dest = tmp_path / "shm" / "M"
    with pytest.raises(st.StageError, match=f"destination {dest} is full"):
        st.stage(str(model), str(dest), workers=2, force=True)
    assert _partials(dest) == []


# -- real layouts: the Hugging Face cache, as its docs describe it ------------------------------
HF_LAYOUTS = ROOT / "tests" / "fixtures" / "stage" / "realworld" / "hf_cache_layouts.txt"


def _layouts() -> dict[str, tuple[str, list[str]]]:
    out, name = {}, None
    for line in HF_LAYOUTS.read_text().splitlines():
        if line.startswith("== "):
            name = line[3:]
            out[name] = ("", [])
        elif line.startswith("snapshot: "):
            out[name] = (line.split(": ", 1)[1], out[name][1])
        elif line and not line.startswith("#"):
            out[name][1].append(line)
    return out


@pytest.mark.parametrize("layout", list(_layouts()))
def test_hf_cache_layouts_stage_without_follow_links(tmp_path, layout):
    """The documented cache layouts (per-repo blobs, and the shared Xet store outside the repo
    directory) are links inside the cache, not out of the source: staged without --follow-links.
    64-hex blob names are the sha256 of the content (the hub's identity, which gpubox checks), so
    the test gives them its own content's sha256 and keeps the layout."""
    import hashlib
    import re

    snapshot, lines = _layouts()[layout]
    cache = tmp_path / "hub"
    names = {}
    for line in lines:
        for h in re.findall(r"\b[0-9a-f]{64}\b", line):
            names.setdefault(h, hashlib.sha256(f"blob {h}\n".encode()).hexdigest())
    for line in lines:
        path, _, target = line.partition(" -> ")
        orig = re.findall(r"\b[0-9a-f]{64}\b", path)
        for h, new in names.items():
            path, target = path.replace(h, new), target.replace(h, new)
        p = cache / path
        p.parent.mkdir(parents=True, exist_ok=True)
        if target:
            p.symlink_to(target)
        else:
            p.write_bytes(f"blob {orig[0]}\n".encode() if orig else b"x\n")
    snap = cache / snapshot
    out = st.stage(str(snap), str(tmp_path / "shm" / "M"), workers=2, force=True)
    assert out["links_out"] == {} and out["copied"] == len(list(snap.iterdir()))
    for p in snap.iterdir():
        assert (tmp_path / "shm" / "M" / p.name).read_bytes() == p.read_bytes()
    # the same snapshot linking one file out of the cache is still refused
    (snap / "extra.bin").symlink_to(tmp_path / "outside.bin")
    (tmp_path / "outside.bin").write_bytes(b"y")
    with pytest.raises(st.StageError, match="links out of it, e.g. extra.bin"):
        st.stage(str(snap), str(tmp_path / "shm" / "M2"), workers=2, force=True)
