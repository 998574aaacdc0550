"""Where the client's stamps come from (bench/clientnet.py, issue 19): on Linux the request is
stamped with the kernel's send timestamp and the first token with its receive timestamp, so an
event loop that is busy (here: blocked on purpose) when the token arrives does not lengthen TTFT;
without kernel stamps the same block lands in TTFT, which is what the stamps are for. Real
sockets, a real simulator process."""

import asyncio
import select
import socket
import sys
import threading
import time

import httpx
import pytest

from gpubox.bench import clientnet
from gpubox.bench.client import Client, Request
from gpubox.bench.clientnet import TimedBackend
from tests.bench_helpers import simserver, wait_unread

linux = pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPING on TCP is Linux's")
SLACK = 5e-5  # kernel stamps are CLOCK_REALTIME, mapped onto perf_counter to within a few microseconds


@pytest.fixture(autouse=True, scope="module")
def _kernel_stamping_is_live():
    """The kernel turns receive stamping on for the whole system lazily (net_enable_timestamp()
    schedules a work item the first time a socket asks), so on a loaded machine the first segments
    after the first request can arrive unstamped. Production falls back then; these tests are about
    the stamps themselves, so they wait (bounded) until a stamp is seen, and keep it on meanwhile."""
    if sys.platform != "linux":
        yield
        return
    rx, tx = (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
    )
    rx.setsockopt(socket.SOL_SOCKET, clientnet.SO_TIMESTAMPING, clientnet.RX_SOFTWARE | clientnet.SOFTWARE)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tx.sendto(b"x", rx.getsockname())
        _, anc, _, _ = rx.recvmsg(8, 256)
        if clientnet._kernel_stamp(anc, time.perf_counter()) is not None:
            break
        time.sleep(0.05)
    yield
    rx.close()
    tx.close()


def _thread_server(script, stamps: bool = False):
    """A plain-socket server in a thread (runs while the client's event loop is blocked)."""
    ls = socket.socket()
    if stamps:  # on the listening socket, so the accepted one has it before the first byte comes
        flags = clientnet.RX_SOFTWARE | clientnet.SOFTWARE
        ls.setsockopt(socket.SOL_SOCKET, clientnet.SO_TIMESTAMPING, flags)
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    out = {}

    def run():
        conn, _ = ls.accept()
        with conn:
            script(conn, out)
        ls.close()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return ls.getsockname()[1], out, th


@linux
def test_kernel_stamp_is_arrival_not_when_the_blocked_loop_reads():
    written = threading.Event()

    def script(conn, out):
        conn.recv(16)  # the client says go
        out["w"] = time.perf_counter()
        conn.sendall(b"token")
        written.set()
        time.sleep(0.5)

    port, out, th = _thread_server(script)

    async def go():
        ns = await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)
        await ns.write(b"go")
        # the loop is blocked while the token arrives: until the server has sent it, then 0.2 s
        # more (waiting on the server, not on a guess of how fast this machine runs it)
        assert written.wait(30)
        seen = wait_unread(ns.get_extra_info("socket"), len(b"token"))
        time.sleep(0.2)
        t_unblocked = time.perf_counter()
        data = await ns.read(100, timeout=5)
        r = (data, ns.get_extra_info("arrival"), ns.get_extra_info("clock"), seen, t_unblocked)
        await ns.aclose()
        return r

    data, arrived, clock, seen, t_unblocked = asyncio.run(go())
    th.join(5)
    assert data == b"token" and clock == "kernel"
    # when it came (after the server's send began, before it was seen waiting in the socket; the
    # send call's end is no bound: loopback's receipt can run after it under load), not when the
    # loop read it
    assert out["w"] - SLACK <= arrived <= seen + SLACK < t_unblocked - 0.2


@linux
def test_kernel_stamp_of_a_read_is_its_last_byte():
    """The documented limit (Linux 'tcp: Extend SOF_TIMESTAMPING_RX_SOFTWARE to TCP recvmsg'): bytes
    that arrived before a late read are returned together with the stamp of the last of them."""

    written = threading.Event()

    def script(conn, out):
        conn.recv(16)
        conn.sendall(b"one")
        time.sleep(0.1)
        out["w2"] = time.perf_counter()
        conn.sendall(b"two")
        written.set()
        time.sleep(0.5)

    port, out, th = _thread_server(script)

    async def go():
        ns = await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)
        await ns.write(b"go")
        assert written.wait(30)  # both writes land while the loop is blocked
        seen = wait_unread(ns.get_extra_info("socket"), len(b"onetwo"))
        time.sleep(0.05)
        data = await ns.read(100, timeout=5)
        r = data, ns.get_extra_info("arrival"), seen
        await ns.aclose()
        return r

    data, arrived, seen = asyncio.run(go())
    th.join(5)
    assert data == b"onetwo"
    assert out["w2"] - SLACK <= arrived <= seen + SLACK


def _blocked_stream(url: str, block_s: float, monkeypatch, tokens: int = 2):
    """One streamed request to a server with 0.5 s TTFT; the event loop blocks for `block_s` from
    0.2 s after the request went out (scheduled by the write itself, so a slow machine cannot
    start the block before the send)."""
    real_write = clientnet.TimedStream.write
    armed = []

    async def write(self, buffer, timeout=None):
        await real_write(self, buffer, timeout)
        if armed and b'"blocked"' in buffer:
            asyncio.get_running_loop().call_later(0.2, time.sleep, armed.pop())

    monkeypatch.setattr(clientnet.TimedStream, "write", write)

    async def go():
        async with Client(url, timeout=10) as c:
            await c.stream(Request(4, prompt="warm"))  # connection open, model known
            armed.append(block_s)
            s = await c.stream(Request(tokens, prompt="a b", extra={"user": "blocked"}))
        async with httpx.AsyncClient() as h:
            truth = {t["user"]: t for t in (await h.get(url + "/sim/truth")).json()}
        return s, truth["blocked"]

    s, t = asyncio.run(go())
    assert not armed, "the request never went out through the timed stream; the test proves nothing"
    return s, t


@linux
def test_ttft_excludes_a_blocked_event_loop(tmp_path, monkeypatch):
    # 2 tok/s: the second token comes after the block, so the first is read alone
    with simserver(tmp_path, "--rate", "2", "--ttft", "0.5", "--no-contention") as srv:
        s, t = _blocked_stream(srv.url, 0.5, monkeypatch=monkeypatch)
    assert s.ok and s.clock == "kernel/kernel" and s.to_dict()["clock"] == "kernel/kernel"
    first = s.started + s.ttft_s
    # inside the simulator's write call (its stamps before and after it), not the loop's wake-up
    assert t["t_first"] - SLACK <= first <= t["t_first_written"] + SLACK
    # (no bound in seconds: the simulator's own write stamp above is the reference, load or not)


@linux
def test_a_first_token_read_with_later_ones_is_flagged_late(tmp_path, monkeypatch):
    # 200 tok/s: all 5 tokens arrive during the block; the stamp is the last byte's, and says so
    with simserver(tmp_path, "--rate", "200", "--ttft", "0.5", "--no-contention") as srv:
        s, t = _blocked_stream(srv.url, 0.5, tokens=5, monkeypatch=monkeypatch)
    assert s.ok and s.clock == "kernel/kernel-late"
    # the last byte of that read: at most the end of the body the simulator wrote during the block
    assert t["t_last"] - SLACK <= s.started + s.ttft_s <= t["t_end_written"] + SLACK


def test_without_kernel_stamps_the_block_lands_in_ttft(tmp_path, monkeypatch):
    monkeypatch.setattr(clientnet, "KERNEL_STAMPS", False)
    with simserver(tmp_path, "--rate", "2", "--ttft", "0.5", "--no-contention") as srv:
        s, t = _blocked_stream(srv.url, 0.5, monkeypatch=monkeypatch)
    assert s.ok and s.clock == "syscall/loop"
    assert s.started + s.ttft_s >= t["t_first"] + 0.1  # stamped when the loop woke up at 0.7 s
    assert s.ttft_s > 0.6


@linux
def test_send_stamp_is_the_kernels_and_precedes_the_servers_receipt():
    def script(conn, out):
        _, anc, _, _ = conn.recvmsg(100, 256)
        out["rx"] = clientnet._kernel_stamp(anc, time.perf_counter())  # the server's kernel receipt
        conn.sendall(b"answer")
        time.sleep(0.3)

    port, out, th = _thread_server(script, stamps=True)

    async def go():
        ns = await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)
        t0 = time.perf_counter()
        await ns.write(b"request", timeout=5)
        t1 = time.perf_counter()
        await ns.read(100, timeout=5)  # the send stamp is read from the error queue before the answer
        r = t0, t1, ns.get_extra_info("sent"), ns.get_extra_info("send_clock")
        await ns.aclose()
        return r

    t0, t1, sent, how = asyncio.run(go())
    th.join(5)
    assert how == "kernel"
    assert t0 - SLACK <= sent <= t1 + SLACK  # inside the write call
    assert out["rx"] is not None and 0 <= out["rx"] - sent < 0.001  # left, then arrived microseconds later


def test_large_write_goes_out_whole_through_a_full_send_buffer():
    size = 8 << 20

    def script(conn, out):
        select.select([conn], [], [], 30)  # the client's first bytes are here
        time.sleep(0.2)  # the client's send buffer fills first
        out["first_read"] = time.perf_counter()  # nothing more could go out before this
        got = 0
        while got < size:
            b = conn.recv(1 << 20)
            if not b:
                break
            got += len(b)
        out["got"] = got
        conn.sendall(b"ok")

    port, out, th = _thread_server(script)

    async def go():
        ns = await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)
        t0 = time.perf_counter()
        await ns.write(b"x" * size, timeout=10)
        sent = ns.get_extra_info("sent"), ns.get_extra_info("send_clock")
        data = await ns.read(10, timeout=5)
        await ns.aclose()
        return t0, sent, data

    t0, (sent, how), data = asyncio.run(go())
    th.join(5)
    assert out["got"] == size and data == b"ok"
    assert how == "syscall"  # more than one segment: the kernel would stamp the last one, so not asked
    # the first bytes went at once (before the server read any), the rest as the server read them
    assert t0 <= sent < out["first_read"]


def test_a_host_name_is_resolved_and_an_address_is_not():
    def script(conn, out):
        out["got"] = conn.recv(16)
        conn.sendall(b"ok")

    port, out, th = _thread_server(script)

    async def go():
        ns = await TimedBackend().connect_tcp("localhost", port, timeout=5)
        await ns.write(b"hi")
        data = await ns.read(10, timeout=5)
        await ns.aclose()
        return data

    data = asyncio.run(go())  # where localhost is ::1 first, that refuses and 127.0.0.1 is tried next
    th.join(5)
    assert data == b"ok" and out["got"] == b"hi"
    assert clientnet._literal("127.0.0.1", 80)[0][4] == ("127.0.0.1", 80)
    assert clientnet._literal("[::1]", 80)[0][0] == socket.AF_INET6
    assert clientnet._literal("localhost", 80) is None
