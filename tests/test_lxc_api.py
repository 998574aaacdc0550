"""The Proxmox API path: real proxmoxer (https backend, API token) against a local HTTPS fake of
the few PVE endpoints gpubox uses: lxc status/current, config (with digest), status/start|stop|
reboot returning a UPID, and tasks/{upid}/status."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpubox.errors import GpuboxError, TransportError
from gpubox.simbox import SimBox, build
from gpubox.simbox.cmds import pct
from gpubox.simbox.core import StandinError
from provision.pve import ApiControl
from tests.clirun import gpubox

TOKEN_USER, TOKEN_NAME, SECRET = "root@pam", "gpubox", "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"


def _cert(dirpath):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve1.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    crt, pem = dirpath / "pve.crt", dirpath / "pve.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


class FakePVE:
    """PVE API fake. Alone it keeps its own container state; given a SimBox it drives that box
    (status from sim.json, lock and config from the simulated 200.conf, actions like `pct`)."""

    def __init__(self, tmp_path, sim: SimBox | None = None, node="pve1", vmid=200, polls=2):
        self.sim, self.node, self.vmid, self.polls = sim, node, vmid, polls
        self.state = {"status": "stopped", "lock": None}
        self.tasks: dict[str, dict] = {}
        self.log: list[tuple[str, str]] = []
        self.finish_tasks = True
        self.fail_with: str | None = None
        self.cert, key = _cert(tmp_path)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, data=None, msg=None):
                body = json.dumps({"data": data} if code == 200 else {"data": None, "message": msg}).encode()
                self.send_response(code, msg)
                self.send_header("Content-Type", "application/json;charset=UTF-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _route(self, method):
                fake.log.append((method, self.path))
                if self.headers.get("Authorization") != f"PVEAPIToken={TOKEN_USER}!{TOKEN_NAME}={SECRET}":
                    return self._send(401, msg="authentication failure")
                m = re.match(r"^/api2/json/nodes/([^/]+)/(.*)$", self.path)
                if not m or m.group(1) != fake.node:
                    return self._send(404, msg="no such node")
                rest = m.group(2)
                t = re.match(r"^tasks/([^/]+)/status$", rest)
                if t and method == "GET":
                    return self._send(200, fake.task_status(t.group(1)))
                c = re.match(rf"^lxc/{fake.vmid}/(status/current|config|status/(start|stop|reboot))$", rest)
                if not c:
                    return self._send(501, msg=f"Method '{method} /nodes/{{node}}/{rest}' not implemented")
                if c.group(1) == "status/current" and method == "GET":
                    return self._send(200, fake.current())
                if c.group(1) == "config" and method == "GET":
                    return self._send(200, fake.config())
                if c.group(2) and method == "POST":
                    return self._send(200, fake.start_task(c.group(2)))
                return self._send(501, msg="not implemented")

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                self._route("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    # -- the PVE side ---------------------------------------------------------------------------
    def _conf_path(self):
        return self.sim.hpath(f"/etc/pve/lxc/{self.vmid}.conf")

    def current(self):
        if self.sim:
            st = self.sim.read_state()["containers"][str(self.vmid)]["status"]
            lock = next((v for k, v in pct.main_section(self.sim, self.vmid) if k == "lock"), None)
        else:
            st, lock = self.state["status"], self.state["lock"]
        d = {"vmid": self.vmid, "status": st, "name": "ct200", "type": "lxc"}
        if lock:
            d["lock"] = lock
        return d

    def config(self):
        raw = self._conf_path().read_bytes()
        d: dict = {"digest": hashlib.sha1(raw).hexdigest()}
        for k, v in pct.main_section(self.sim, self.vmid):
            if k.startswith("lxc."):
                d.setdefault("lxc", []).append([k, v])
            else:
                d[k] = v
        return d

    def start_task(self, action):
        n = len(self.tasks)
        upid = f"UPID:{self.node}:0001{n:04X}:00A1B2C3:6745F0{n:02X}:vz{action}:{self.vmid}:{TOKEN_USER}!{TOKEN_NAME}:"
        self.tasks[upid] = {"action": action, "polls": 0}
        return upid

    def task_status(self, upid):
        t = self.tasks[upid]
        t["polls"] += 1
        if not self.finish_tasks or t["polls"] < self.polls:
            return {"upid": upid, "status": "running", "type": f"vz{t['action']}"}
        if "exitstatus" not in t:
            t["exitstatus"] = self._run(t["action"])
        return {"upid": upid, "status": "stopped", "exitstatus": t["exitstatus"], "type": f"vz{t['action']}"}

    def _run(self, action):
        if self.fail_with:
            return self.fail_with
        if not self.sim:
            self.state["status"] = "stopped" if action == "stop" else "running"
            return "OK"
        try:
            if action == "start":
                pct.start(self.sim, self.vmid)
            elif action == "stop":
                pct.stop(self.sim, self.vmid)
            else:
                pct.stop(self.sim, self.vmid, must_run=True)
                pct.start(self.sim, self.vmid)
        except StandinError as exc:
            return str(exc)
        return "OK"

    def posts(self):
        return [p for m, p in self.log if m == "POST"]

    def api(self, **kw):
        return {"host": "127.0.0.1", "port": self.port, "user": TOKEN_USER, "token_name": TOKEN_NAME,
                "verify_ssl": str(self.cert), "poll": 0.05, **kw}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pve(tmp_path):
    f = FakePVE(tmp_path)
    yield f
    f.close()


def _ctl(pve, secret=SECRET, timeout=10, **api):
    return ApiControl(pve.api(**api), secret, "pve1", 200, timeout=timeout, poll=0.05)


def test_start_posts_and_waits_for_the_task(pve):
    ctl = _ctl(pve)
    assert ctl.status() == {"status": "stopped", "lock": None}
    ctl.act("start")
    assert ctl.status()["status"] == "running"
    assert pve.posts() == ["/api2/json/nodes/pve1/lxc/200/status/start"]
    (task,) = pve.tasks.values()
    assert task["polls"] >= 2  # it waited on the UPID until the task stopped
    ctl.act("reboot")
    assert pve.posts()[-1].endswith("/status/reboot")


def test_locked_container_is_refused_before_any_post(pve):
    pve.state["lock"] = "backup"
    with pytest.raises(GpuboxError, match=r"locked \(backup\)"):
        _ctl(pve).act("stop")
    assert pve.posts() == []


def test_failed_task_is_reported_with_its_exit_status(pve):
    pve.fail_with = "startup for container '200' failed"
    with pytest.raises(GpuboxError, match="startup for container '200' failed"):
        _ctl(pve).act("start")


def test_task_that_never_ends_times_out(pve):
    pve.finish_tasks = False
    with pytest.raises(GpuboxError, match="did not finish in 0.5 s"):
        _ctl(pve, timeout=0.5).act("start")


def test_wrong_token_is_a_clear_error(pve):
    with pytest.raises(GpuboxError, match="401"):
        _ctl(pve, secret="wrong").status()


def test_untrusted_certificate_is_refused(pve):
    with pytest.raises(TransportError, match="certificate not trusted"):
        _ctl(pve, verify_ssl=True).status()


def test_config_digest_is_the_files_sha1(tmp_path):
    sim = build(tmp_path / "box", ["uvm_stale_major"], gpus=2)
    fake = FakePVE(tmp_path, sim)
    try:
        cfg = _ctl(fake).config()
    finally:
        fake.close()
    assert cfg["digest"] == hashlib.sha1(sim.hpath("/etc/pve/lxc/200.conf").read_bytes()).hexdigest()
    assert ["lxc.cgroup2.devices.allow", "c 508:* rwm"] in cfg["lxc"]
    assert "snaptime" not in cfg  # snapshot keys are not the current config


def _api_box(tmp_path, fake_factory, faults):
    sim = build(tmp_path / "box", faults, gpus=2)
    fake = fake_factory(sim)
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"].update(
        gpubox_api=fake.api(), gpubox_api_token_env="PVE_TOKEN_SECRET_TEST")
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    return sim, fake


def test_fix_through_the_api_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PVE_TOKEN_SECRET_TEST", SECRET)
    sim, fake = _api_box(tmp_path, lambda s: FakePVE(tmp_path, s), ["uvm_missing", "uvm_stale_major"])
    try:
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200", "--yes", "--json")
        doc = json.loads(out)
        assert rc == 0, doc
        ct = next(s for s in doc["steps"] if s["name"] == "container")
        assert ct["commands"] == [["POST", "/api2/json/nodes/pve1/lxc/200/status/reboot"]]
        assert ct["evidence"]["control"] == "api"
        assert fake.posts() == ["/api2/json/nodes/pve1/lxc/200/status/reboot"]
        assert not [c for c in sim.calls("pct") if c["argv"][:1] != ["status"]]  # no pct start/reboot
        assert sim.read_state()["containers"]["200"]["boots"] == 1
    finally:
        fake.close()


def test_api_without_the_token_in_the_environment_is_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PVE_TOKEN_SECRET_TEST", raising=False)
    sim, fake = _api_box(tmp_path, lambda s: FakePVE(tmp_path, s), ["container_stopped"])
    try:
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200", "--json")
    finally:
        fake.close()
    assert rc == 2 and out == ""
    assert "PVE_TOKEN_SECRET_TEST" in err and "export" in err and len(err.strip().splitlines()) == 1
    assert fake.log == []
