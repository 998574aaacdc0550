"""Socket layer under httpx for the benchmark client: arrival timestamps and a cheap read path.

httpx, httpcore and h11 still do all of HTTP; this replaces only httpcore's network backend
(a documented plug-in point: `httpcore.AsyncConnectionPool(network_backend=...)`). Hand-written
because, measured with benchmarks/client_accuracy.py and cProfile on a 2-core machine:

- httpcore's default anyio backend wraps every read in a cancel scope and re-registers the socket
  with epoll (add_reader/remove_reader), about half of the client's CPU per SSE chunk; here an
  asyncio Protocol stays registered and read() pops a buffered segment;
- a token can only be timestamped when the client task runs, after h11 parsing and after whatever
  other streams the event loop serves first: the first token was stamped 13 ms late (median) at
  64 streams. Here data_received (run as soon as the loop polls the socket) stamps each segment,
  read() returns one segment at a time, and `get_extra_info("arrival")` is the time the bytes
  just handed to h11 left the socket, whatever the task did in between.

asyncio turns on TCP_NODELAY for every TCP transport, so small request writes are not held back by
Nagle's algorithm (checked in tests/test_bench_clientnet.py). http:// only; https:// and proxies
keep httpx's own transport (the client then stamps with perf_counter at read time).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import httpcore
import httpx

PAUSE_AT = 1 << 20  # stop reading the socket while this many bytes wait for h11


class _Proto(asyncio.Protocol):
    def __init__(self) -> None:
        self.segs: deque[tuple[float, bytes]] = deque()
        self.size = 0
        self.eof = False
        self.exc: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.drained: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None
        self.paused = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.segs.append((time.perf_counter(), data))
        self.size += len(data)
        if self.size > PAUSE_AT and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc) -> None:
        self.eof = True
        self.exc = exc
        self._wake()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(httpcore.ReadTimeout("no data within the read timeout"))


class TimedStream(httpcore.AsyncNetworkStream):
    """One TCP connection; each read returns bytes from one socket read and remembers when."""

    def __init__(self, proto: _Proto) -> None:
        self._p = proto
        self.arrival: float | None = None
        self.sent: float | None = None  # when the current request's first bytes went to the socket
        self._new_request = True

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        p = self._p
        if not p.segs:
            if p.eof:
                if p.exc is not None:
                    raise httpcore.ReadError(str(p.exc))
                return b""
            loop = asyncio.get_running_loop()
            p.waiter = fut = loop.create_future()
            h = loop.call_later(timeout, _expire, fut) if timeout is not None else None
            try:
                await fut
            finally:
                p.waiter = None
                if h is not None:
                    h.cancel()
            if not p.segs:
                if p.exc is not None:
                    raise httpcore.ReadError(str(p.exc))
                return b""
        t, data = p.segs[0]
        if len(data) > max_bytes:
            p.segs[0] = (t, data[max_bytes:])
            data = data[:max_bytes]
        else:
            p.segs.popleft()
        p.size -= len(data)
        if p.paused and p.size < PAUSE_AT // 2:
            p.paused = False
            p.transport.resume_reading()
        self.arrival = t
        self._new_request = True  # the next write starts the next request on this connection
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        p = self._p
        if p.eof or p.transport.is_closing():
            raise httpcore.WriteError("connection closed")
        p.transport.write(buffer)
        if self._new_request:  # TTFT starts here: the request is on the wire, not queued in the client
            self.sent = time.perf_counter()
            self._new_request = False
        if p.drained is not None:
            try:
                await asyncio.wait_for(asyncio.shield(p.drained), timeout)
            except asyncio.TimeoutError:
                raise httpcore.WriteTimeout("send buffer did not drain") from None

    async def aclose(self) -> None:
        if self._p.transport is not None:
            self._p.transport.close()

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        raise httpcore.ConnectError("TimedBackend is http:// only")  # Client never routes https here

    def get_extra_info(self, info: str):
        p = self._p
        if info == "arrival":
            return self.arrival
        if info == "sent":
            return self.sent
        if info == "is_readable":  # httpcore asks this of idle keep-alive connections
            return bool(p.segs) or p.eof
        if info == "ssl_object":
            return None
        if info == "client_addr":
            return p.transport.get_extra_info("sockname")
        if info == "server_addr":
            return p.transport.get_extra_info("peername")
        if info == "socket":
            return p.transport.get_extra_info("socket")
        return None


class TimedBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options=None) -> TimedStream:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(_Proto, host, port,
                                       local_addr=(local_address, 0) if local_address else None), timeout)
        except asyncio.TimeoutError:
            raise httpcore.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        sock = proto.transport.get_extra_info("socket")
        for opt in socket_options or ():
            sock.setsockopt(*opt)
        return TimedStream(proto)

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.ConnectError("TimedBackend does not do unix sockets")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _lane(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's own transport for one connection, with TimedBackend under its pool.

    httpx has no public hook for a network backend, so its pool is replaced; if a future httpx
    drops `_pool`, the plain transport stays and timestamps fall back to read time."""
    t = httpx.AsyncHTTPTransport(verify=False, limits=limits)  # http:// only: no CA bundle to load
    if hasattr(t, "_pool"):
        t._pool = httpcore.AsyncConnectionPool(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=limits.keepalive_expiry,
            network_backend=TimedBackend())
    return t


class _LaneStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, release) -> None:
        self._inner, self._release = inner, release

    async def __aiter__(self):
        async for part in self._inner:
            yield part

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._release()


class LaneTransport(httpx.AsyncBaseTransport):
    """One single-connection httpx transport per request in flight, reused from a free list.

    httpcore's pool re-scans every connection for every queued request on each request start and
    end (O(C^2) per round: 170,000 is_idle calls and ~0.6 s of CPU to start 64 streams, measured
    with cProfile), which delayed the client's own sends and reads while streams ramped up. A free
    list makes that O(1); HTTP itself is still httpx/httpcore/h11."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = httpx.Limits(max_connections=1, max_keepalive_connections=1,
                                    keepalive_expiry=limits.keepalive_expiry)
        self._free: list[httpx.AsyncHTTPTransport] = []
        self._all: list[httpx.AsyncHTTPTransport] = []
        self._cap = limits.max_connections
        self._sem: asyncio.Semaphore | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._cap or 1 << 30)
        await self._sem.acquire()
        lane = self._free.pop() if self._free else None
        if lane is None:
            lane = _lane(self._limits)
            self._all.append(lane)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._free.append(lane)
                self._sem.release()

        try:
            resp = await lane.handle_async_request(request)
        except BaseException:
            release()
            raise
        return httpx.Response(status_code=resp.status_code, headers=resp.headers,
                              stream=_LaneStream(resp.stream, release), extensions=resp.extensions)

    async def aclose(self) -> None:
        for lane in self._all:
            await lane.aclose()
        self._all.clear()
        self._free.clear()


def timed_transport(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    """The client's transport for http:// servers: free-listed lanes over TimedBackend."""
    return LaneTransport(limits)


def sent(response: httpx.Response) -> float | None:
    """When the request of this response was written to the socket (None without TimedStream)."""
    ns = response.extensions.get("network_stream")
    return ns.get_extra_info("sent") if ns is not None else None


def arrival(response: httpx.Response) -> float:
    """When the bytes the client is looking at reached it: TimedStream's stamp, else now."""
    ns = response.extensions.get("network_stream")
    t = ns.get_extra_info("arrival") if ns is not None else None
    return t if t is not None else time.perf_counter()
