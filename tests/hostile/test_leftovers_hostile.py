"""Cleaning up after a kill, and the rest of the leftovers: a killed run's temp files on the box are
removed (and said) by the next run; a fresh one of a run still writing is left alone; the alert
hook's timeout kills the hook's whole process tree; a gzip answer is decoded (bounded)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpubox.simbox import build
from tests.clirun import gpubox

OLD = time.time() - 3600


def _plant(path, text="half\n", mtime=OLD):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def test_a_killed_runs_temps_are_removed_and_said(tmp_path, capsys):
    sim = build(tmp_path / "box", ("numa_balancing",))
    planted = [
        _plant(sim.hpath("/etc/sysctl.d/.90-gpubox-numa.conf.gpubox.tmp.4242.deadbeef")),
        _plant(sim.hpath("/etc/modules-load.d/.nvidia-uvm.conf.gpubox.4242.tmp")),  # an older release's
        _plant(sim.hpath("/etc/systemd/system/.gpubox-pcie-mrrs.service.gpubox.tmp.99.abcd")),
    ]
    fresh = _plant(sim.hpath("/etc/sysctl.d/.other.conf.gpubox.tmp.77.beef"), mtime=time.time())
    foreign = _plant(sim.hpath("/etc/sysctl.d/.hidden.tmp"))
    # Proxmox's own temp naming: gpubox's config writer uses it too, but removes only the temps its
    # journal recorded (provision/confjournal.py, tests/test_lxc_pmxcfs.py); one it never recorded
    # is a Proxmox task's, however old.
    proxmox = _plant(sim.hpath("/etc/pve/lxc/200.conf.tmp.4242"))
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "numa", "ct200", "--json")
    assert rc in (0, 1), err
    left = [str(p) for p in planted if p.exists()]
    assert left == [], f"a killed run's temps are still there: {left}"
    said = json.loads(out).get("removed_temps", [])
    assert len(said) == len(planted), said
    assert fresh.exists(), "DAMAGE: a temp that may still be written was removed"
    assert foreign.exists(), "DAMAGE: a file gpubox does not own was removed"
    assert proxmox.exists(), "DAMAGE: a Proxmox-named temp gpubox never recorded was removed"


def test_a_read_only_run_removes_nothing(tmp_path, capsys):
    sim = build(tmp_path / "box", ())
    p = _plant(sim.hpath("/etc/sysctl.d/.x.conf.gpubox.tmp.4242.deadbeef"))
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct200", "--json")
    assert p.exists(), "DAMAGE: doctor (read-only) changed the box"


def test_alert_hook_timeout_kills_its_process_tree(tmp_path, capsys):
    from gpubox.bench import alert
    from gpubox.host import Host
    from gpubox.inventory import HostEntry
    from gpubox.transport.local import LocalTransport

    pids = tmp_path / "pids"
    hook = tmp_path / "hook.sh"
    hook.write_text(
        "#!/bin/sh\nsleep 300 & echo $! >> {p}\nsetsid sleep 301 & echo $! >> {p}\nsleep 60\n".format(p=pids)
    )
    hook.chmod(0o755)
    h = Host(HostEntry("ct", {}), LocalTransport("ct"))
    doc = {"verdict": {"status": "failed", "reasons": []}, "box": "ct200", "run_id": "r", "measurements": []}
    t0 = time.monotonic()
    out = alert.fire(h, [str(hook)], doc, timeout=1)
    took = time.monotonic() - t0
    assert out["fired"] and not out["ok"], out
    time.sleep(0.3)
    alive = []
    for pid in map(int, pids.read_text().split()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                alive.append(pid)
                os.kill(pid, 9)
        except FileNotFoundError:
            pass
    assert alive == [], f"DAMAGE: the hook's children outlived its timeout: {alive}"
    assert took < 250, "gpubox waited for a daemonised grandchild's pipes (it sleeps 301 s)"


class _Gzip(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


@pytest.mark.parametrize("kind", ["json", "bomb"])
def test_gzip_answer_is_decoded_and_bounded(kind):
    import httpx

    from gpubox.bench import client

    raw = json.dumps({"data": [{"id": "m"}]}).encode() if kind == "json" else b"0" * (64 << 20)
    _Gzip.body = gzip.compress(raw)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Gzip)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:

        async def go():
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.server_port}") as c:
                async with c.stream("GET", "/v1/models") as r:
                    return await client._read_bounded(r, 1 << 20)

        if kind == "json":
            assert json.loads(asyncio.run(go())) == {"data": [{"id": "m"}]}
        else:
            with pytest.raises(client.BadAnswer, match="larger than"):
                asyncio.run(go())
    finally:
        srv.shutdown()
        srv.server_close()
