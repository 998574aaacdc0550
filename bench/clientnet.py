"""Socket layer under httpx for the benchmark client: kernel arrival timestamps and a cheap read path.

One module (about 550 lines): the backend, its stream and the timestamp reader are one httpcore
plug-in and change together.

httpx, httpcore and h11 still do all of HTTP; this replaces only httpcore's network backend
(a documented plug-in point: `httpcore.AsyncConnectionPool(network_backend=...)`). Hand-written
because, measured with benchmarks/client_accuracy.py, benchmarks/ttft_wire.py and cProfile on a
2-core machine:

- httpcore's default anyio backend wraps every read in a cancel scope and re-registers the socket
  with epoll (add_reader/remove_reader), about half of the client's CPU per SSE chunk; here the
  socket stays registered and read() pops a buffered segment;
- a token can only be timestamped when the client runs, after whatever other streams the event
  loop serves first: stamped in the task, the first token was 13 ms late (median) at 64 streams;
  stamped in the loop's read callback, still +3.5% TTFT against a loopback capture at 32 streams
  (issue 19). So the socket is read with recvmsg and the kernel's own software receive stamp
  (SO_TIMESTAMPING, SOF_TIMESTAMPING_RX_SOFTWARE): for TCP, Linux (>= 4.14, "tcp: Extend
  SOF_TIMESTAMPING_RX_SOFTWARE to TCP recvmsg") returns the arrival time of the last byte the
  read returned, keeping that invariant when it coalesces segments in the receive queue. However
  late the loop gets to the socket, the stamp is when the bytes arrived; it is later than the first
  token's arrival only when more bytes of the same stream had arrived before the read (a loop delay
  longer than the inter-token time; the client marks such a sample `kernel-late`).
- the request's stamp (`sent`) is the kernel's software send stamp of its first write, asked for
  per sendmsg (SOF_TIMESTAMPING_TX_SOFTWARE in a control message) and read from the error queue:
  the moment the segment went to the device, where a packet capture sees it. Stamping when send()
  returned instead was late by the rest of the syscall (~30 us), and by milliseconds when the
  client was preempted in between (seen: a request 6.9 ms "faster" than the wire, load 7).
Where the kernel gives no stamp (not Linux, an unknown socket ABI, an older kernel), send() return
and the read callback's perf_counter are used; `clock(response)` says which was used.

Nagle is turned off (TCP_NODELAY, as asyncio does for its transports), so small request writes
are not held back (checked in tests/test_bench_clientnet.py). http:// only; https:// and proxies
keep httpx's own transport (the client then stamps with perf_counter at read time).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import platform
import socket
import struct
import sys
import time
from collections import deque

import httpcore
import httpx

PAUSE_AT = 1 << 20  # stop reading the socket while this many bytes wait for h11
MAX_READ = 256 << 10  # one recvmsg
# SO_TIMESTAMPING(_OLD) is 37 in include/uapi/asm-generic/socket.h, used by x86, arm, arm64, riscv,
# powerpc, s390, loongarch; alpha, mips, parisc and sparc number it differently, so no kernel stamps
# there (Python's socket module does not export the constant). Flags from linux/net_tstamp.h. The
# cmsg (SCM_TIMESTAMPING, same number) is struct scm_timestamping {struct timespec ts[3];}, ts[0]
# the software stamp, old timespec {long tv_sec; long tv_nsec;} on CLOCK_REALTIME.
SO_TIMESTAMPING = 37
TX_SOFTWARE, RX_SOFTWARE, SOFTWARE, OPT_TSONLY = 1 << 1, 1 << 3, 1 << 4, 1 << 11
_TS3 = struct.Struct("@llllll")
_CMSG = socket.CMSG_SPACE(_TS3.size) if hasattr(socket, "CMSG_SPACE") else 0
_ERR_CMSG = 512  # SCM_TIMESTAMPING + IP(V6)_RECVERR's sock_extended_err and its address
_TX_NOW = [(socket.SOL_SOCKET, SO_TIMESTAMPING, struct.pack("I", TX_SOFTWARE))]
_OTHER_ABI = ("alpha", "mips", "parisc", "sparc")
KERNEL_STAMPS = True  # False: stamp in the read callback (benchmarks/ttft_wire.py compares the two)


def _kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp every segment this socket receives and to report send stamps asked
    for per sendmsg (docs: Documentation/networking/timestamping.rst); True when it accepted."""
    if not KERNEL_STAMPS or sys.platform != "linux" or not _CMSG:
        return False
    if platform.machine().lower().startswith(_OTHER_ABI):
        return False
    flags = RX_SOFTWARE | SOFTWARE | OPT_TSONLY
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
        return sock.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING) & flags == flags
    except OSError:
        return False


class _RealToMono:
    """CLOCK_REALTIME (the kernel's stamps) to perf_counter (CLOCK_MONOTONIC, the client's clock).

    The offset between the two clocks changes only when the wall clock is stepped, so it is measured
    once a second rather than per read (reading a clock costs 1-8 us on a VM): best of three
    realtime reads bracketed by monotonic reads, within ~1 us."""

    def __init__(self) -> None:
        self.off_ns = 0
        self.at = float("-inf")

    def __call__(self, real_ns: int, now: float) -> float:
        if now - self.at > 1.0:
            best = None
            for _ in range(3):
                a = time.perf_counter_ns()
                b = time.time_ns()
                c = time.perf_counter_ns()
                if best is None or c - a < best[0]:
                    best = (c - a, b - (a + c) // 2)
            self.off_ns, self.at = best[1], now
        return min((real_ns - self.off_ns) * 1e-9, now)  # never after the read that returned the bytes


_to_mono = _RealToMono()


def _kernel_stamp(anc, now: float) -> float | None:
    """The software SCM_TIMESTAMPING of one recvmsg on the perf_counter clock, else None."""
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(raw) >= _TS3.size:
            sec, nsec = _TS3.unpack_from(raw)[:2]
            if sec or nsec:
                return _to_mono(sec * 1_000_000_000 + nsec, now)
    return None


class _Conn:
    """One non-blocking TCP socket, registered with the loop for reading as long as it is open.

    What asyncio's transport does, by hand, because the transport reads with recv() and writes with
    send(), so it drops the ancillary data that carries the kernel's stamps. A send stamp asked for
    with sendmsg comes back on the socket's error queue (EPOLLERR wakes the read callback), which
    is drained before the data, so it is known before the answer is read."""

    def __init__(self, sock: socket.socket, kernel: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock, self.fd, self.kernel = sock, sock.fileno(), kernel
        self.segs: deque[tuple[float, bytes, str]] = deque()
        self.size = 0
        self.eof = self.closed = self.reading = False
        self.exc: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.wbuf = bytearray()
        self.drained: asyncio.Future | None = None
        self.first_out: float | None = None  # perf_counter after the send() that took a write's first bytes
        self.tx_at: float | None = None  # kernel's stamp of the last send that asked for one
        self.tx_pending = 0
        try:
            self.mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG) if kernel else 0
        except OSError:
            self.mss = 0
        self.read_on()

    def read_on(self) -> None:
        if not self.reading and not self.closed:
            self.loop.add_reader(self.fd, self._readable)
            self.reading = True

    def read_off(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _readable(self) -> None:
        if self.tx_pending:
            self._errqueue()
        try:
            if self.kernel:
                data, anc, _, _ = self.sock.recvmsg(MAX_READ, _CMSG)
            else:
                data, anc = self.sock.recv(MAX_READ), ()
        except (BlockingIOError, InterruptedError):
            if self.kernel:
                self._errqueue()  # woken by EPOLLERR alone: an unread error queue would wake us forever
            return
        except OSError as exc:
            self._lost(exc)
            return
        now = time.perf_counter()
        if not data:
            self.eof = True
            self.read_off()
            self._wake()
            return
        k = _kernel_stamp(anc, now) if anc else None
        self.segs.append((now, data, "loop") if k is None else (k, data, "kernel"))
        self.size += len(data)
        if self.size > PAUSE_AT:
            self.read_off()
        self._wake()

    def _errqueue(self) -> None:
        """Read the kernel's send stamps (MSG_ERRQUEUE, no data with OPT_TSONLY)."""
        while True:
            try:
                _, anc, _, _ = self.sock.recvmsg(0, _ERR_CMSG, socket.MSG_ERRQUEUE)
            except OSError:  # BlockingIOError: queue empty
                return
            k = _kernel_stamp(anc, time.perf_counter())
            if k is not None:
                self.tx_at = k
                self.tx_pending = max(self.tx_pending - 1, 0)

    def send(self, data: bytes, stamp: bool = False) -> float | None:
        """Hand bytes to the kernel now where it takes them, the rest when the socket drains.
        `stamp`: ask the kernel for the time these bytes leave (tx_at, where kernel stamps work).

        Returns perf_counter after the send() that took the first of these bytes, None when none
        went now (then `first_out` is set when the first of them go)."""
        if self.wbuf:
            self.wbuf += data
            return None
        if stamp:
            self.tx_at = None
            # the kernel stamps the segment with the write's last byte: the request's first segment
            # only when the write fits in one (request headers always do)
            stamp = self.kernel and len(data) <= self.mss
        try:
            if stamp:
                try:
                    n = self.sock.sendmsg([data], _TX_NOW)
                    self.tx_pending += n > 0
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT):
                        raise
                    self.mss = 0  # a kernel that takes no SO_TIMESTAMPING cmsg (< 4.7): send() stamps
                    n = self.sock.send(data)
            else:
                n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from None
        t = time.perf_counter() if n else None
        self.first_out = t
        if n < len(data):
            self.wbuf += data[n:]
            self.drained = self.loop.create_future()
            self.loop.add_writer(self.fd, self._writable)
        return t

    def _writable(self) -> None:
        try:
            n = self.sock.send(self.wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if n and self.first_out is None:
            self.first_out = time.perf_counter()
        del self.wbuf[:n]
        if not self.wbuf:
            self.loop.remove_writer(self.fd)
            self._drain_done()

    def _drain_done(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    def _lost(self, exc: BaseException | None) -> None:
        self.eof, self.exc = True, exc
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.read_off()
        if self.wbuf:
            self.loop.remove_writer(self.fd)
            self.wbuf.clear()
        self.closed = True
        self.eof = True
        self._drain_done()
        self._wake()
        self.sock.close()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(httpcore.ReadTimeout("no data within the read timeout"))


class TimedStream(httpcore.AsyncNetworkStream):
    """One TCP connection; each read returns bytes from one socket read and remembers when."""

    def __init__(self, conn: _Conn) -> None:
        self._c = conn
        self.arrival: float | None = None
        self.clock: str | None = None  # "kernel" | "loop": where `arrival` came from
        self.sent: float | None = None  # when the current request's first bytes went to the socket
        self._new_request = True

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        c = self._c
        if not c.segs:
            if c.eof:
                if c.exc is not None:
                    raise httpcore.ReadError(str(c.exc))
                return b""
            loop = asyncio.get_running_loop()
            c.waiter = fut = loop.create_future()
            h = loop.call_later(timeout, _expire, fut) if timeout is not None else None
            try:
                await fut
            finally:
                c.waiter = None
                if h is not None:
                    h.cancel()
            if not c.segs:
                if c.exc is not None:
                    raise httpcore.ReadError(str(c.exc))
                return b""
        t, data, src = c.segs[0]
        if len(data) > max_bytes:
            c.segs[0] = (t, data[max_bytes:], src)
            data = data[:max_bytes]
        else:
            c.segs.popleft()
        c.size -= len(data)
        if not c.reading and not c.eof and c.size < PAUSE_AT // 2:
            c.read_on()
        self.arrival, self.clock = t, src
        self._new_request = True  # the next write starts the next request on this connection
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        c = self._c
        if c.eof or c.closed:
            raise httpcore.WriteError("connection closed")
        t = c.send(buffer, stamp=self._new_request)
        if c.drained is not None:
            try:
                await asyncio.wait_for(asyncio.shield(c.drained), timeout)
            except asyncio.TimeoutError:
                raise httpcore.WriteTimeout("send buffer did not drain") from None
            if c.exc is not None:
                raise httpcore.WriteError(str(c.exc))
            t = t or c.first_out
        if self._new_request:
            # TTFT starts here, not when the client decided to send: the kernel's stamp of the first
            # write leaving (get_extra_info("sent"), once read from the error queue), else the moment
            # the send() that took its first bytes returned (later by the syscall, or a preemption)
            self.sent = t if t is not None else time.perf_counter()
            self._new_request = False

    async def aclose(self) -> None:
        self._c.close()

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        raise httpcore.ConnectError("TimedBackend is http:// only")  # Client never routes https here

    def get_extra_info(self, info: str):
        c = self._c
        if info == "arrival":
            return self.arrival
        if info == "clock":
            return self.clock
        if info == "sent":
            return c.tx_at if c.tx_at is not None else self.sent
        if info == "send_clock":
            return "kernel" if c.tx_at is not None else "syscall"
        if info == "is_readable":  # httpcore asks this of idle keep-alive connections
            return bool(c.segs) or c.eof
        if info == "ssl_object":
            return None
        if info in ("client_addr", "server_addr"):
            try:
                return c.sock.getsockname() if info == "client_addr" else c.sock.getpeername()
            except OSError:
                return None
        if info == "socket":
            return c.sock
        return None


def _literal(host: str, port: int) -> list | None:
    """An IP address needs no resolver (getaddrinfo runs in a thread: a hop per connection)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if ip.version == 4:
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (str(ip), port))]
    return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (str(ip), port, 0, 0))]


class TimedBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options=None,
    ) -> TimedStream:
        loop = asyncio.get_running_loop()
        try:
            infos = _literal(host, port) or await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
            )
        except asyncio.TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        last: Exception = httpcore.ConnectError(f"{host}:{port}: no address")
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for opt in socket_options or ():
                    sock.setsockopt(*opt)
                if local_address:
                    sock.bind((local_address, 0))
                kernel = _kernel_stamps(sock)  # before connecting: every segment of the answer is stamped
                await asyncio.wait_for(loop.sock_connect(sock, addr), timeout)
            except asyncio.TimeoutError:
                sock.close()
                last = httpcore.ConnectTimeout(f"connect to {host}:{port} timed out")
                continue
            except OSError as exc:
                sock.close()
                last = httpcore.ConnectError(str(exc))
                continue
            except BaseException:
                sock.close()
                raise
            return TimedStream(_Conn(sock, kernel))
        raise last

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
            max_connections=1,
            max_keepalive_connections=1,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=TimedBackend(),
        )
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
        self._limits = httpx.Limits(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=limits.keepalive_expiry
        )
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
        return httpx.Response(
            status_code=resp.status_code,
            headers=resp.headers,
            stream=_LaneStream(resp.stream, release),
            extensions=resp.extensions,
        )

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


def clock(response: httpx.Response) -> tuple[str, str]:
    """Where the request's send stamp and the last arrival stamp came from: send kernel (the
    kernel's send stamp) | syscall (send() returned); arrival kernel (receive stamp) | loop (read
    callback); both "read" without TimedStream (httpx's own transport, stamped by the client)."""
    ns = response.extensions.get("network_stream")
    if ns is None or ns.get_extra_info("clock") is None:
        return "read", "read"
    return ns.get_extra_info("send_clock"), ns.get_extra_info("clock")


def arrival(response: httpx.Response) -> float:
    """When the bytes the client is looking at reached it: TimedStream's stamp, else now."""
    ns = response.extensions.get("network_stream")
    t = ns.get_extra_info("arrival") if ns is not None else None
    return t if t is not None else time.perf_counter()
