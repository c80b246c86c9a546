"""redis-py over Sluice's shared-memory transport (``sluice serve --shm PATH``).

    import redis, sluice
    r = redis.Redis(connection_pool=sluice.shm_pool("/run/sluice/shm.sock"))
    r.set("k", "v"); r.get("k")

This module needs redis-py and nothing else of the package (not its compiled
part): it can be loaded from its file alone.

redis-py runs unmodified: :class:`ShmConnection` hands it a socket-like
object whose bytes go through the client's two rings in a sealed memfd the
server handed over (docs/FORMAT.md, "Shared-memory transport"). Requests
are copied into the request ring and published with one store; replies are
read from the response ring, a frame at a time. Waiting for a reply spins
briefly, then parks on the futex word in the control block.

Pure Python (mmap, ctypes for the futex): Python has no memory fence, so
where the Rust client relies on one (to see that the server thread went to
sleep), this client wakes the server's eventfd whenever a reply is slow to
come; a missed wake-up costs at most one spin, never a hang.
"""

import ctypes
import errno
import mmap
import os
import platform
import select
import socket
import struct
import time

import redis
from redis.connection import AbstractConnection

__all__ = ["ShmSocket", "ShmConnection", "shm_pool", "Refused"]

HANDSHAKE_VERSION = 2
HELLO = b"SLUSHMHI" + struct.pack("<II", HANDSHAKE_VERSION, 0)
ANSWER_BYTES = 24
MAX_REFUSAL_BYTES = 512
CONTROL_BYTES = 4096
# Control block offsets (docs/FORMAT.md).
OFF_MAGIC = 0
OFF_REQUEST_BYTES = 8
OFF_RESPONSE_BYTES = 12
OFF_REQUEST_TAIL = 128
OFF_RESPONSE_TAIL = 256
OFF_SERVER_SLEEPING = 320
OFF_CLIENT_SLEEPING = 384
OFF_CLOSED = 448
MAGIC = int.from_bytes(b"SLUSHM\x02\x00", "little")
# Frames in the rings (docs/FORMAT.md): a u64 header (payload length in the
# low half, lap stamp in the high half), the payload, padding to the next
# 64-byte line, where the next frame starts.
FRAME_HEADER_BYTES = 8
FRAME_ALIGN_BYTES = 64
WRAP_LENGTH = 0xFFFFFFFF

SPIN_SECONDS = 50e-6
PARK_SECONDS = 0.001
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)


def _lap(pos, size):
    """The stamp of a frame header at stream position pos: its lap, plus one."""
    return pos // size % 0xFFFFFFFF + 1


def _frame_bytes(payload):
    """Ring bytes a frame of payload bytes takes: header, payload, padding."""
    return (FRAME_HEADER_BYTES + payload + FRAME_ALIGN_BYTES - 1) & ~(FRAME_ALIGN_BYTES - 1)


class Refused(redis.ConnectionError):
    """The server refused the shared-memory connection (e.g. max clients)."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class ShmSocket:
    """The socket calls redis-py makes, over a client's two rings."""

    def __init__(self, path, timeout=None):
        self.path = path
        self._timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(10)
            self._sock.connect(path)
            self._sock.sendall(HELLO)
            msg, fds, _flags, _addr = socket.recv_fds(
                self._sock, ANSWER_BYTES + MAX_REFUSAL_BYTES, 2
            )
        except OSError:
            self._sock.close()
            raise
        try:
            self._admit(msg, fds)
        except BaseException:
            for fd in fds:
                os.close(fd)
            self._sock.close()
            raise
        self._sock.settimeout(None)

    def _admit(self, msg, fds):
        if len(msg) < ANSWER_BYTES:
            raise redis.ConnectionError(
                f"{self.path}: the server's answer is {len(msg)} bytes (is it a Sluice --shm socket?)"
            )
        magic = msg[:8]
        version, word = struct.unpack_from("<II", msg, 8)
        if version != HANDSHAKE_VERSION:
            raise redis.ConnectionError(
                f"the server speaks version {version} of the shared-memory transport; this client speaks {HANDSHAKE_VERSION}"
            )
        if magic == b"SLUSHMNO":
            raise Refused(msg[ANSWER_BYTES : ANSWER_BYTES + word].decode(errors="replace"))
        if magic != b"SLUSHMOK" or len(fds) != 2:
            raise redis.ConnectionError(f"{self.path}: not a Sluice shared-memory answer")
        memfd, self._eventfd = fds
        size = os.fstat(memfd).st_size
        self._mm = mmap.mmap(memfd, size)
        os.close(memfd)
        view = memoryview(self._mm)
        self._q = view[:CONTROL_BYTES].cast("Q")
        self._i = view[:CONTROL_BYTES].cast("I")
        if self._q[OFF_MAGIC // 8] != MAGIC:
            raise redis.ConnectionError(f"{self.path}: the shared region is not Sluice's layout")
        request_bytes = self._i[OFF_REQUEST_BYTES // 4]
        response_bytes = self._i[OFF_RESPONSE_BYTES // 4]
        if CONTROL_BYTES + request_bytes + response_bytes != size:
            raise redis.ConnectionError(f"{self.path}: the shared region's sizes do not add up")
        self._request = view[CONTROL_BYTES : CONTROL_BYTES + request_bytes]
        self._response = view[CONTROL_BYTES + request_bytes :]
        self._request_bytes = request_bytes
        self._response_bytes = response_bytes
        self._request_q = self._request.cast("Q")
        self._response_q = self._response.cast("Q")
        # A fresh region: both streams start at position 0.
        self._request_head = 0
        self._response_tail = 0
        self._response_taken = 0
        self._futex_word = ctypes.c_uint32.from_buffer(self._mm, OFF_CLIENT_SLEEPING)
        self._closed = False

    # What redis-py calls.
    def settimeout(self, timeout):
        self._timeout = timeout

    def gettimeout(self):
        return self._timeout

    def setsockopt(self, *args):
        pass

    def getsockname(self):
        return self.path

    def fileno(self):
        return self._sock.fileno()

    def sendall(self, data):
        data = memoryview(data).cast("B")
        while len(data):
            n = self._write(data)
            if n:
                data = data[n:]
                self._nudge()
                continue
            # The request ring is full: the server drains it.
            self._notify()
            self._check_alive()
            time.sleep(PARK_SECONDS / 10)

    def recv(self, bufsize):
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        notified = False
        start = time.monotonic()
        while True:
            got = self._read(bufsize)
            if got:
                self._nudge()
                return got
            if self._i[OFF_CLOSED // 4]:
                return b""
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise socket.timeout("timed out waiting for the server's reply")
            if now - start < SPIN_SECONDS:
                continue
            if not notified:
                # Without a fence the sleeping flag may read stale: wake the
                # server once per slow reply, whatever it says.
                self._notify()
                notified = True
            self._park(PARK_SECONDS if deadline is None else min(PARK_SECONDS, deadline - now))
            self._check_alive()

    def recv_into(self, buffer, nbytes=0):
        data = self.recv(nbytes or len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def shutdown(self, how):
        try:
            self._sock.shutdown(how)
        except OSError:
            pass

    def close(self):
        if self._closed:
            return
        self._closed = True
        self._futex_word = None
        for v in (self._q, self._i, self._request_q, self._response_q, self._request, self._response):
            v.release()
        self._mm.close()
        os.close(self._eventfd)
        self._sock.close()

    # The rings.
    def _room(self, pos, free):
        """Payload bytes a frame at stream position pos can take: it may not
        cross the ring's end, and the header slot after it must be free."""
        to_end = self._request_bytes - pos % self._request_bytes
        limit = min(to_end, free - FRAME_HEADER_BYTES) & ~(FRAME_ALIGN_BYTES - 1)
        return max(0, limit - FRAME_HEADER_BYTES)

    def _publish(self, pos, length, taken):
        """Zeroes the slot after the frame at pos, then stores its header."""
        size = self._request_bytes
        after = pos + taken
        self._request_q[after % size // 8] = 0
        self._request_q[pos % size // 8] = _lap(pos, size) << 32 | length
        self._request_head = after

    def _write(self, data):
        size = self._request_bytes
        tail = self._q[OFF_REQUEST_TAIL // 8]
        used = self._request_head - tail
        if used < 0 or used > size:
            raise redis.ConnectionError("the shared-memory ring is corrupt (request tail)")
        pos, free = self._request_head, size - used
        room = self._room(pos, free)
        if room < len(data):
            to_end = size - pos % size
            if free >= to_end + FRAME_HEADER_BYTES and self._room(pos + to_end, free - to_end) > room:
                self._publish(pos, WRAP_LENGTH, to_end)
                pos, free = pos + to_end, free - to_end
                room = self._room(pos, free)
        n = min(len(data), room)
        if n == 0:
            return 0
        at = pos % size + FRAME_HEADER_BYTES
        self._request[at : at + n] = data[:n]
        self._publish(pos, n, _frame_bytes(n))
        return n

    def _frame_at(self, pos):
        """The payload length of the response frame at pos (WRAP_LENGTH for
        a wrap marker), or None if none is published there yet."""
        size = self._response_bytes
        header = self._response_q[pos % size // 8]
        if header == 0:
            return None
        stamp, length = header >> 32, header & 0xFFFFFFFF
        to_end = size - pos % size
        if (
            stamp != _lap(pos, size)
            or length == 0
            or (length != WRAP_LENGTH and FRAME_HEADER_BYTES + length > to_end)
        ):
            raise redis.ConnectionError(
                f"the shared-memory ring is corrupt (response frame header {header:#x} at byte {pos})"
            )
        return length

    def _read(self, most):
        size = self._response_bytes
        pieces, got, moved = [], 0, False
        while got < most:
            length = self._frame_at(self._response_tail)
            if length is None:
                break
            at = self._response_tail % size
            if length == WRAP_LENGTH:
                if self._response_taken:
                    raise redis.ConnectionError("the shared-memory ring is corrupt (a wrap inside a frame)")
                self._response_tail += size - at
                moved = True
                continue
            n = min(length - self._response_taken, most - got)
            start = at + FRAME_HEADER_BYTES + self._response_taken
            pieces.append(bytes(self._response[start : start + n]))
            got += n
            self._response_taken += n
            if self._response_taken == length:
                self._response_tail += _frame_bytes(length)
                self._response_taken = 0
                moved = True
        if moved:
            self._q[OFF_RESPONSE_TAIL // 8] = self._response_tail
        return b"".join(pieces)

    def _nudge(self):
        if self._i[OFF_SERVER_SLEEPING // 4]:
            self._i[OFF_SERVER_SLEEPING // 4] = 0
            self._notify()

    def _notify(self):
        try:
            os.write(self._eventfd, (1).to_bytes(8, "little"))
        except BlockingIOError:
            pass

    def _park(self, seconds):
        self._i[OFF_CLIENT_SLEEPING // 4] = 1
        if self._frame_at(self._response_tail) is None and _SYS_FUTEX is not None:
            ts = _Timespec(int(seconds), int((seconds % 1) * 1e9))
            _libc.syscall(
                _SYS_FUTEX,
                ctypes.byref(self._futex_word),
                _FUTEX_WAIT,
                1,
                ctypes.byref(ts),
                None,
                0,
            )
        elif _SYS_FUTEX is None:
            time.sleep(seconds)
        self._i[OFF_CLIENT_SLEEPING // 4] = 0

    def _check_alive(self):
        readable, _, _ = select.select([self._sock], [], [], 0)
        if readable:
            # The server never writes here: readable means it hung up.
            raise redis.ConnectionError(f"{self.path}: the server closed the connection")


class ShmConnection(AbstractConnection):
    """A redis-py connection over Sluice's shared-memory transport."""

    def __init__(self, path="", socket_timeout=None, **kwargs):
        super().__init__(**kwargs)
        self.path = path
        self.socket_timeout = socket_timeout

    def repr_pieces(self):
        pieces = [("path", self.path), ("db", self.db)]
        if self.client_name:
            pieces.append(("client_name", self.client_name))
        return pieces

    def _connect(self):
        return ShmSocket(self.path, self.socket_timeout)

    def _host_error(self):
        return self.path


def shm_pool(path, **kwargs):
    """A redis-py connection pool whose connections use the shared-memory
    transport of ``sluice serve --shm path``."""
    return redis.ConnectionPool(connection_class=ShmConnection, path=path, **kwargs)
