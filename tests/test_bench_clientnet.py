"""The client's socket layer (bench/clientnet.py) on real loopback sockets: bytes are stamped when
they leave the socket (not when the task reads them), one read never spans two arrivals, Nagle is
off, timeouts and closed connections surface as httpcore errors, and the lane transport reuses and
caps connections. End to end: a token is never stamped before the simulator wrote it."""

import asyncio
import socket
import threading
import time

import httpcore
import httpx
import pytest

from gpubox.bench.client import Client, Request, run_concurrent
from gpubox.bench.clientnet import LaneTransport, TimedBackend
from tests.bench_helpers import simserver, unread, wait_unread

SLACK = 5e-5  # kernel stamps are CLOCK_REALTIME, mapped onto perf_counter to within a few microseconds


async def _server(handler):
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


def test_arrival_is_socket_time_and_reads_split_at_arrivals():
    """Each piece is sent by a thread while the client's event loop is blocked (busy elsewhere):
    it is seen waiting in the socket, and only a while later can the loop read it. Its stamp lies
    between its send and that moment: the kernel's receipt, not the read. The backend reads the
    first piece before the second is sent, and the two reads return them apart. No bound depends
    on how fast this machine runs (a receipt after the send call returned, as loopback's can be in
    ksoftirqd under load, is fine)."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    send_a, send_b, done, sent = threading.Event(), threading.Event(), threading.Event(), {}

    def server():
        conn, _ = lsock.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for name, ev, data in (("a", send_a, b"first"), ("b", send_b, b"second")):
                ev.wait(10)
                sent[name] = time.perf_counter()  # no piece can arrive before its send began
                conn.sendall(data)
            done.wait(10)

    th = threading.Thread(target=server, daemon=True)
    th.start()

    async def client():
        ns = await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)
        sock = ns.get_extra_info("socket")
        nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        send_a.set()  # the loop is blocked from here until "first" waits in the socket, and 20 ms on
        seen_a = wait_unread(sock, len(b"first"))
        time.sleep(0.02)
        deadline = time.perf_counter() + 10
        while unread(sock) and time.perf_counter() < deadline:  # the backend takes it (no read yet)
            await asyncio.sleep(0.001)
        send_b.set()  # blocked again, for "second"
        seen_b = wait_unread(sock, len(b"second"))
        time.sleep(0.02)
        one = await ns.read(65536, timeout=5)
        a = ns.get_extra_info("arrival")
        two = await ns.read(65536, timeout=5)
        b = ns.get_extra_info("arrival")
        await ns.aclose()
        return nodelay, seen_a, seen_b, one, a, two, b

    try:
        nodelay, seen_a, seen_b, one, a, two, b = asyncio.run(client())
    finally:
        for ev in (send_a, send_b, done):
            ev.set()
        th.join(10)
        lsock.close()
    assert nodelay == 1
    assert (one, two) == (b"first", b"second")  # one read = one arrival, not merged
    assert sent["a"] - SLACK <= a <= seen_a + SLACK
    assert sent["b"] - SLACK <= b <= seen_b + SLACK
    assert a < b


def test_read_timeout_and_partial_reads():
    async def go():
        async def handler(r, w):
            w.write(b"0123456789")
            await w.drain()
            await asyncio.sleep(1)

        srv, port = await _server(handler)
        async with srv:
            ns = await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)
            parts = [await ns.read(4, timeout=5), await ns.read(4, timeout=5), await ns.read(4, timeout=5)]
            with pytest.raises(httpcore.ReadTimeout):
                await ns.read(4, timeout=0.1)
            await ns.aclose()
            return parts

    assert asyncio.run(go()) == [b"0123", b"4567", b"89"]


def test_connect_refused_is_connect_error():
    async def go():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        with pytest.raises(httpcore.ConnectError):
            await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)

    asyncio.run(go())


def test_lanes_reuse_connections_and_respect_the_cap(tmp_path):
    with simserver(tmp_path, "--rate", "2000", "--ttft", "0.01", "--no-contention") as s:

        async def go():
            async with Client(s.url, timeout=5, max_connections=3) as c:
                lanes: LaneTransport = c._http._transport
                assert isinstance(lanes, LaneTransport)
                for _ in range(3):
                    assert (await c.stream(Request(5, prompt="a"))).ok
                seq = len(lanes._all)
                smp, _ = await run_concurrent(c, [Request(20, prompt="a") for _ in range(8)], 8)
                return seq, len(lanes._all), len(lanes._free), smp

        seq, total, free, smp = asyncio.run(go())
    assert seq == 1  # sequential requests share one keep-alive connection
    assert total == 3 and free == 3  # 8 in flight wanted, the cap of 3 held, all returned
    assert all(x.ok and x.output_tokens == 20 for x in smp)


def test_token_is_never_stamped_before_the_server_wrote_it(tmp_path):
    with simserver(tmp_path, "--rate", "200", "--ttft", "0.03", "--no-contention") as s:

        async def go():
            async with Client(s.url, timeout=5) as c:
                reqs = [Request(10, prompt="a b", extra={"user": f"u{i}"}) for i in range(6)]
                smp, _ = await run_concurrent(c, reqs, 6)
            async with httpx.AsyncClient() as h:
                truth = {t["user"]: t for t in (await h.get(s.url + "/sim/truth")).json()}
            return smp, truth

        smp, truth = asyncio.run(go())
    for i, x in enumerate(smp):
        t = truth[f"u{i}"]
        assert x.ok and t["output_tokens"] == x.output_tokens == 10
        assert x.started + x.ttft_s >= t["t_first"]  # causality: the stamp follows the write
        assert x.started + x.e2e_s >= t["t_last"]
        assert x.ttft_s >= 0.03
