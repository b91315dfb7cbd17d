"""cp-kvstore's operations over its binary protocol (ZHT section 2.2.1),
against a real single-node server on 127.0.0.1: insert, lookup, remove,
append, cswap, callback with and without timeout, the epoch check, and a
malformed frame.  The frame layout is the one in kvstore/kv.h."""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostcluster import free_base

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "build/dr-tests/workloads/kvstore/cp-kvstore"
INSERT, LOOKUP, REMOVE, APPEND, CSWAP, CALLBACK = range(1, 7)
OK, NOTFOUND, MISMATCH, TIMEOUT, WRONG_EPOCH, ERROR = range(6)


def request(addr: tuple[str, int], op: int, key: bytes, val: bytes = b"",
            val2: bytes = b"", epoch: int = 1, timeout_ms: int = 0,
            opid: int = 0) -> tuple[int, int, bytes]:
    body = struct.pack("<B3xIQIIII", op, epoch, opid, len(key), len(val),
                       len(val2), timeout_ms) + key + val + val2
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(struct.pack("<I", len(body)) + body)
        n = struct.unpack("<I", _recv(s, 4))[0]
        rep = _recv(s, n)
    status, _epoch, seq, vlen = struct.unpack_from("<B3xIQI", rep)
    return status, seq, rep[20:20 + vlen]


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "server closed the connection"
        out += chunk
    return out


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    assert BIN.exists(), f"{BIN} is not built (ninja -C build)"
    port = free_base(1)     # the port and port+1, free right now
    disk = tmp_path / "d.img"
    with open(disk, "wb") as f:
        f.truncate(4 << 20)
    with open(tmp_path / "log", "wb") as log:
        p = subprocess.Popen([str(BIN), "--role", "server", "--node", "0",
                              "--peers", f"127.0.0.1:{port}", "--disk", str(disk),
                              "--partitions", "4"],
                             stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    addr = ("127.0.0.1", port)
    try:
        # Generous: on a loaded 2-core machine the server can take seconds
        # to listen; a server that exited or never listens fails here, with
        # its log, rather than as a refused connection in the test body.
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(addr, timeout=1).close()
                break
            except OSError:
                assert p.poll() is None and time.monotonic() < deadline, \
                    "cp-kvstore server did not listen:\n" + (tmp_path / "log").read_text()
                time.sleep(0.05)
        yield addr
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_insert_lookup_remove(server: tuple[str, int]) -> None:
    assert request(server, LOOKUP, b"k")[0] == NOTFOUND
    st, seq1, _ = request(server, INSERT, b"k", b"v1")
    assert st == OK and seq1 >= 1
    st, seq2, _ = request(server, INSERT, b"k", b"v2")
    assert st == OK and seq2 > seq1
    assert request(server, LOOKUP, b"k")[::2] == (OK, b"v2")
    assert request(server, REMOVE, b"k")[0] == OK
    assert request(server, LOOKUP, b"k")[0] == NOTFOUND
    assert request(server, REMOVE, b"k")[0] == NOTFOUND


def test_append_returns_the_list(server: tuple[str, int]) -> None:
    for tok in (b"a;", b"b;", b"c;"):
        assert request(server, APPEND, b"dir", tok)[0] == OK
    assert request(server, LOOKUP, b"dir")[::2] == (OK, b"a;b;c;")


def test_cswap(server: tuple[str, int]) -> None:
    assert request(server, CSWAP, b"ctr", b"", b"1")[0] == OK     # absent -> 1
    st, _, cur = request(server, CSWAP, b"ctr", b"5", b"6")
    assert (st, cur) == (MISMATCH, b"1")
    assert request(server, CSWAP, b"ctr", b"1", b"2")[0] == OK
    assert request(server, LOOKUP, b"ctr")[::2] == (OK, b"2")


def test_callback_timeout_and_notify(server: tuple[str, int]) -> None:
    t0 = time.monotonic()
    assert request(server, CALLBACK, b"state", b"ready", timeout_ms=200)[0] == TIMEOUT
    assert time.monotonic() - t0 >= 0.19
    got: list[tuple[int, int, bytes]] = []
    waiter = threading.Thread(target=lambda: got.append(
        request(server, CALLBACK, b"state", b"ready", timeout_ms=10000)))
    waiter.start()
    time.sleep(0.2)
    assert request(server, INSERT, b"state", b"ready")[0] == OK
    waiter.join(10)
    assert got and got[0][0] == OK and got[0][2] == b"ready"


def test_wrong_epoch_gets_the_table(server: tuple[str, int]) -> None:
    st, _, table = request(server, INSERT, b"k", b"v", epoch=7)
    assert st == WRONG_EPOCH and table.startswith(b"epoch=1 nodes=1 parts=4")
    assert request(server, LOOKUP, b"k")[0] == NOTFOUND          # not applied


def test_malformed_frame_is_refused(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=5) as s:
        s.sendall(struct.pack("<I", 3) + b"xyz")
        n = struct.unpack("<I", _recv(s, 4))[0]
        assert _recv(s, n)[0] == ERROR
        assert s.recv(1) == b""                     # and the connection closes
    assert request(server, INSERT, b"still", b"up")[0] == OK


def test_random_frames_do_not_kill_the_server(server: tuple[str, int]) -> None:
    """Garbage on both ports (clients' and replicas'): every frame gets an
    error reply or a closed connection, and the server keeps serving."""
    rnd = random.Random(7)
    for port in (server[1], server[1] + 1):
        for _ in range(200):
            n = rnd.choice([0, 3, 31, 32, 33, 64, 200])
            body = bytes(rnd.randrange(256) for _ in range(n))
            if n >= 32 and rnd.random() < 0.7:     # valid op, random fields
                body = bytes([rnd.randrange(1, 12)]) + body[1:]
            with socket.create_connection((server[0], port), timeout=5) as s:
                s.settimeout(0.5)
                try:
                    s.sendall(struct.pack("<I", len(body)) + body)
                    s.recv(4)
                except TimeoutError:
                    pass                            # e.g. a callback waiting
                except (ConnectionResetError, BrokenPipeError):
                    # The server closed a connection whose input it had not
                    # read (it rejects a frame by its header): the kernel
                    # answers with RST.  A closed connection is allowed.
                    pass
    assert request(server, INSERT, b"alive", b"yes")[0] == OK
    assert request(server, LOOKUP, b"alive")[::2] == (OK, b"yes")


def test_config_check_never_writes(tmp_path: Path) -> None:
    """`-n` on a blank disk reports it and leaves it blank."""
    disk = tmp_path / "blank.img"
    with open(disk, "wb") as f:
        f.truncate(1 << 20)
    out = subprocess.run([str(BIN), "-n", "--node", "0", "--peers", "127.0.0.1",
                          "--disk", str(disk)], capture_output=True, text=True,
                         timeout=30, check=False)
    assert out.returncode == 0 and "is blank" in out.stdout, out
    assert disk.read_bytes() == bytes(1 << 20)
