"""ICMP echo to ADDR every INTERVAL seconds until stdin closes; one line
per reply, `sent_at rtt_ms received_at` (time.time()), then `lost N`.

Run in the guest's host namespace (`ip netns exec HOST python3 ...`) by
pause_designs_probe.py, to see what a held guest network does to the
guest's replies.  The lab has no ping binary, hence this.  Kept free of
project imports (it runs with the system Python).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import time


def checksum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    t = sum(struct.unpack(f"!{len(b) // 2}H", b))
    t = (t >> 16) + (t & 0xFFFF)
    t += t >> 16
    return ~t & 0xFFFF


def echo(ident: int, seq: int) -> bytes:
    body = b"cutpoint" * 4
    head = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    return struct.pack("!BBHHH", 8, 0, checksum(head + body), ident, seq) + body


def main() -> int:
    addr, interval = sys.argv[1], float(sys.argv[2])
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xFFFF
    sent: dict[int, float] = {}
    seq, nxt, stop_at = 0, time.time(), None
    while stop_at is None or time.time() < stop_at:
        now = time.time()
        if stop_at is None and now >= nxt:
            s.sendto(echo(ident, seq & 0xFFFF), (addr, 0))
            sent[seq & 0xFFFF] = now
            seq, nxt = seq + 1, nxt + interval
        ready, _, _ = select.select([s, sys.stdin], [], [], 0.001)
        if sys.stdin in ready and stop_at is None and not sys.stdin.readline():
            stop_at = time.time() + 2.0  # replies still held or in flight
        if s in ready:
            data = s.recv(2048)
            kind, _, _, who, sq = struct.unpack("!BBHHH", data[20:28])
            if kind == 0 and who == ident and sq in sent:
                got = time.time()
                print(f"{sent[sq]:.6f} {(got - sent.pop(sq)) * 1000:.3f} {got:.6f}", flush=True)
    print(f"lost {len(sent)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
