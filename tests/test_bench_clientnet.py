"""The client's socket layer (bench/clientnet.py) on real loopback sockets: bytes are stamped when
they leave the socket (not when the task reads them), one read never spans two arrivals, Nagle is
off, timeouts and closed connections surface as httpcore errors, and the lane transport reuses and
caps connections. End to end: a token is never stamped before the simulator wrote it."""

import asyncio
import socket
import time

import httpcore
import httpx
import pytest

from gpubox.bench.client import Client, Request, run_concurrent
from gpubox.bench.clientnet import LaneTransport, TimedBackend
from tests.bench_helpers import simserver

SLACK = 5e-5  # kernel stamps are CLOCK_REALTIME, mapped onto perf_counter to within a few microseconds


async def _server(handler):
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


def test_arrival_is_socket_time_and_reads_split_at_arrivals():
    async def go():
        sent = {}

        async def handler(r, w):
            # each write bracketed by stamps: the kernel stamps loopback's receipt inside the send
            # call, so the arrival lies between them however late this machine runs the handler
            sent["a"] = time.perf_counter()
            w.write(b"first")
            sent["a_done"] = time.perf_counter()
            await w.drain()
            await asyncio.sleep(0.05)
            sent["b"] = time.perf_counter()
            w.write(b"second")
            sent["b_done"] = time.perf_counter()
            await w.drain()
            await asyncio.sleep(0.2)
            w.close()

        srv, port = await _server(handler)
        async with srv:
            ns = await TimedBackend().connect_tcp("127.0.0.1", port, timeout=5)
            nodelay = ns.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            await asyncio.sleep(0.15)  # the task is busy elsewhere; both pieces have arrived
            t_read = time.perf_counter()
            one = await ns.read(65536, timeout=5)
            a = ns.get_extra_info("arrival")
            two = await ns.read(65536, timeout=5)
            b = ns.get_extra_info("arrival")
            eof = await ns.read(65536, timeout=5)
            await ns.aclose()
            return sent, nodelay, t_read, one, a, two, b, eof

    sent, nodelay, t_read, one, a, two, b, eof = asyncio.run(go())
    assert nodelay == 1
    assert (one, two, eof) == (b"first", b"second", b"")  # one read = one arrival, not merged
    # stamped at arrival (inside the server's write call), not when the client read it
    assert sent["a"] - SLACK <= a <= sent["a_done"] + SLACK < t_read
    assert sent["b"] - SLACK <= b <= sent["b_done"] + SLACK
    assert b - a >= 0.05 - SLACK  # the two pieces' own arrivals, the 50 ms pause between them


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
