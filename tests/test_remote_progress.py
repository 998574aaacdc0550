"""Live progress from the container: the transport hands the remote side's stderr lines over as
they arrive (real sshd, `pct exec` through the simulated host's pct stand-in, local processes), a
remote stage shows bytes as they are copied, a remote benchmark each measurement as it runs, and
the remote side is never quiet for more than about a second (a quiet remote is a hung one)."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpubox import progress as gp
from gpubox.simbox import build
from gpubox.simbox.model import MODEL_DEST, MODEL_SRC
from gpubox.transport.local import LocalTransport
from gpubox.transport.pct import PctTransport
from tests.clirun import gpubox
from tests.sshd import container_over_ssh
from tests.test_bench_remote import _inventory

# Three lines 0.6 s apart, then exit: a transport that buffers until the end delivers all at once.
# The ticker prints when (CLOCK_MONOTONIC, the same clock in every process of this machine) it
# wrote its last line: a streamed first line arrives before that, a buffered one after.
TICKER = (
    "import sys, time\n"
    "for i in range(3):\n"
    "    last = time.monotonic()\n"
    '    print(\'gpubox-progress {"ev":"step","desc":"p%d","advance":true}\' % i, file=sys.stderr, flush=True)\n'
    "    time.sleep(0.6)\n"
    "print('done', last)\n"
)


def _assert_live(transport):
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    r = transport.run(
        [sys.executable, "-c", TICKER], timeout=30, on_stderr=lambda l: seen.append((time.monotonic(), l))
    )
    word, last = r.stdout.split()
    assert r.rc == 0 and word == "done"
    assert [gp.parse(l)["desc"] for _, l in seen] == ["p0", "p1", "p2"]
    assert r.stderr.count("gpubox-progress") == 3  # still in the result as well
    # The first line arrived before the command wrote its last one: streamed, not buffered (no
    # margin in seconds: the command's own stamp is the reference, however slow this machine is).
    assert seen[0][0] < float(last), (seen[0][0] - t0, float(last) - t0)


def test_local_transport_streams_stderr_lines():
    _assert_live(LocalTransport())


def test_ssh_transport_streams_stderr_lines(sshd):
    t = sshd.transport()
    try:
        _assert_live(t)
    finally:
        t.close()


def test_pct_transport_streams_through_the_host(tmp_path):
    sim = build(tmp_path / "box", [])
    from gpubox.context import Context
    from gpubox.inventory import Inventory

    ctx = Context(box=Inventory(sim.inventory_path).box(sim.box))
    host = ctx.host.transport
    pct = PctTransport("ct", host, sim.vmid, host_env=ctx.host.env)
    _assert_live(pct)


def test_line_progress_batches_and_keeps_the_remote_audible():
    from gpubox.provision.stage import LineProgress

    buf = io.StringIO()
    p = LineProgress(buf, every=0.1, alive=0.3)
    p.start(1000, "staging m")
    for _ in range(10):
        p.advance(10)
    time.sleep(1.0)  # no bytes move: "alive" advances of 0 keep coming
    p.advance(900)
    p.stop()
    evs = [gp.parse(l) for l in buf.getvalue().splitlines()]
    assert evs[0] == {"ev": "start", "total": 1000, "desc": "staging m"} and evs[-1] == {"ev": "stop"}
    assert sum(e.get("n", 0) for e in evs) == 1000
    assert len(evs) < 20  # batched, not a line per advance
    assert sum(1 for e in evs if e == {"ev": "advance", "n": 0}) >= 2


class Recorder:
    def __init__(self):
        self.calls = []

    def start(self, total, desc):
        self.calls.append(("start", total, desc, time.monotonic()))

    def advance(self, n):
        self.calls.append(("advance", n, None, time.monotonic()))

    def stop(self):
        self.calls.append(("stop", None, None, time.monotonic()))


def test_remote_stage_over_ssh_shows_bytes_as_they_are_copied(tmp_path, sshd, monkeypatch):
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.pipeline import run_steps
    from gpubox.provision import stage as engine
    from gpubox.provision.stage_step import steps

    sim = build(tmp_path / "box", ["shm_empty"])
    container_over_ssh(sim.inventory_path, sim.box, sshd)
    bars: list[Recorder] = []
    monkeypatch.setattr(engine, "rich_progress", lambda console=None: bars.append(Recorder()) or bars[-1])
    i = Inventory(sim.inventory_path)
    ctx = Context(box=i.box(sim.box), inventory=i, options={}, console=object())
    assert not ctx.container.transport.is_local
    try:
        rep = run_steps(ctx, steps(ctx), "apply")
    finally:
        ctx.close()
    assert [s.status for s in rep.steps] == ["fixed", "fixed"], [s.detail for s in rep.steps]
    src_bytes = sum(f.stat().st_size for f in sim.cpath(MODEL_SRC).rglob("*") if f.is_file())
    model = next(b for b in bars if b.calls and MODEL_DEST.rsplit("/", 1)[-1] in b.calls[0][2])
    kinds = [c[0] for c in model.calls]
    assert kinds[0] == "start" and kinds[-1] == "stop" and "advance" in kinds
    total = model.calls[0][1]
    assert 0 < total <= src_bytes
    assert sum(c[1] for c in model.calls if c[0] == "advance") == total


def _this_checkout_python(tmp_path) -> str:
    """The container's python importing THIS checkout (sshd's sessions get no PYTHONPATH)."""
    w = tmp_path / "checkout-python"
    root = Path(__file__).resolve().parents[1]
    w.write_text(f'#!/bin/sh\nPYTHONPATH={root} exec {sys.executable} "$@"\n')
    w.chmod(0o755)
    return str(w)


def _slow_start_inventory(sim, tmp_path, container, host=None, startup=3.0):
    from gpubox.simbox.server import SIM_SPEED

    path = _inventory(sim, tmp_path, container=container, host=host, python=_this_checkout_python(tmp_path))
    inv = yaml.safe_load(open(path).read())
    b = inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_bench"]
    b["command"] = b["command"] + ["--startup-s", str(startup * SIM_SPEED)]
    open(path, "w").write(yaml.safe_dump(inv))
    return path


@pytest.mark.parametrize("via", ["ssh", "pct"])
def test_remote_bench_shows_each_measurement_and_never_goes_quiet(
    via, tmp_path, capsys, monkeypatch, request
):
    import gpubox.bench.runner as runner

    steps: list[tuple[float, str, bool]] = []

    def fake_progress(console, total):
        steps.append((time.monotonic(), f"total={total}", False))
        return None, lambda desc, advance=True: steps.append((time.monotonic(), desc, advance))

    monkeypatch.setattr(runner, "_progress", fake_progress)
    sim = build(tmp_path / "box", [])
    if via == "ssh":
        sshd = request.getfixturevalue("sshd")
        inv = _slow_start_inventory(sim, tmp_path, sshd.vars(), sshd.vars())
    else:
        inv = _slow_start_inventory(sim, tmp_path, {"gpubox_connection": "pct"})
    relays: list[gp.Relay] = []
    real_relay = gp.Relay
    monkeypatch.setattr(gp, "Relay", lambda **kw: relays.append(real_relay(**kw)) or relays[-1])
    t0 = time.monotonic()
    rc, out, err = gpubox(capsys, "-i", inv, "bench", "ct200", "--json", "--out", tmp_path / "results")
    end = time.monotonic()
    assert rc == 0, err
    doc = json.loads(out)
    names = [d for _, d, adv in steps if d and not d.startswith("total=")]
    total = int(steps[0][1].split("=")[1])
    assert total == len(doc["measurements"]) > 0
    assert "TP1 auto: starting server" in names[0]
    # one line per measurement as it starts, one advance as it ends
    assert sum(1 for _, d, adv in steps[1:] if adv) == total
    assert len([n for n in names if n.startswith("TP1 auto ")]) == total
    # The 3 s server start is covered by "alive" lines: no gap over 1.5 s from start to end.
    times = [t0] + relays[-1].times + [end]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps[1:-1]) < 1.5, gaps
    assert any(e.get("ev") == "alive" for e in relays[-1].events)
