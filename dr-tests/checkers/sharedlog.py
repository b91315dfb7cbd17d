"""Recovery checker for cp-sharedlog (a compact Scalog, seeds/002 Chapter 3).

It reads the raw disk of every node and rebuilds everything the way the
servers do:
- the segments, and their backups;
- each ordering replica's Paxos log;
- each client's ack journal.

From the committed cut log it recomputes every global sequence number with
the lexicographic rule of §3.3.1. It then checks:

- replay_clean: every log replays cleanly; only a torn tail is allowed.
- cut_log_agrees: the ordering replicas agree on every committed slot, and
  together they hold a gap-free log.
- cuts_monotonic: every cut is at least the previous one, entry by entry.
  Shards enter a cut only after they were added, and they stay frozen once
  their finalization takes effect.
- no_holes: up to the last cut, both replicas of every segment hold every
  record, identical on both; every gsn from the trim point to the end is
  a record.
- acked_present: every acknowledged append is in the ordered log with the
  payload hash the client recorded.
- gsn_deterministic: the recomputed gsn and shard of every acknowledged
  append are the ones the client was given.
- ack_order: an append issued after another's acknowledgement (the same
  client's next one) has a higher gsn.
- no_phantoms: every ordered record is exactly the payload its
  (client, seq) would have, and appears once.
- restart_gsns_higher: appends acknowledged after a restart got gsns above
  every append acknowledged before it.
"""

from __future__ import annotations

import itertools
import socket
import struct
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.checkers.rawlog import scan_region

SB_SIZE = 4096
SB_MAGIC = b"CPSLDSK1"
NORDER = 3
REG_OWN, REG_BACKUP, REG_ORDER, REG_CLIENT = range(4)
CMD_NOOP, CMD_CUT, CMD_ADD_SHARD, CMD_FINALIZE, CMD_TRIM = range(5)
MASK64 = (1 << 64) - 1
CHECKS = ["replay_clean", "cut_log_agrees", "cuts_monotonic", "no_holes",
          "acked_present", "gsn_deterministic", "ack_order", "no_phantoms",
          "restart_gsns_higher"]
MSG = struct.Struct("<BBxxIQQQI4x")
SL_SUBSCRIBE, SL_STATUS = 13, 14


class LogCheckError(Exception):
    """An input could not be read or is not a cp-sharedlog disk."""


def fnv64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def _mix(x: int) -> int:
    x &= MASK64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    return x ^ (x >> 33)


def payload(client: int, seq: int) -> bytes:
    """The record cp-sharedlog's client appends for (client, seq)."""
    r = _mix((client << 40) ^ seq)
    text = f"c{client}.s{seq}:".encode()
    fill = 16 + r % 64
    body = bytes(ord("a") + _mix(r + i) % 26 for i in range(fill))
    return struct.pack("<IQ", client, seq) + text + body


@dataclass
class Ack:
    client: int
    seq: int
    gsn: int
    shard: int
    hash: int
    epoch: int


@dataclass
class NodeDisk:
    path: str
    node: int
    nnodes: int
    own: list[bytes]
    backup: list[bytes]
    committed: dict[int, bytes]
    accepted: dict[int, tuple[int, bytes]]
    acks: list[Ack]
    problems: list[str]


def read_disk(path: str | Path) -> NodeDisk:
    p = str(path)
    try:
        with open(p, "rb") as f:
            sb = f.read(SB_SIZE)
            if len(sb) < SB_SIZE or sb[:8] != SB_MAGIC:
                raise LogCheckError(f"{p}: not a cp-sharedlog disk")
            if zlib.crc32(sb[:SB_SIZE - 4]) != struct.unpack_from("<I", sb, SB_SIZE - 4)[0]:
                raise LogCheckError(f"{p}: superblock checksum mismatch")
            _v, node, nnodes = struct.unpack_from("<III", sb, 8)
            rsize = struct.unpack_from("<Q", sb, 24)[0]
            regions = []
            for r in range(4):
                f.seek(SB_SIZE + r * rsize)
                regions.append(f.read(rsize))
    except OSError as e:
        raise LogCheckError(f"{p}: {e}") from e
    problems: list[str] = []
    scans = [scan_region(regions[r], 1) for r in range(4)]
    for name, s in zip(("own segment", "backup segment", "order log",
                        "client journal"), scans, strict=True):
        problems += [f"{p} {name}: {x}" for x in s.problems]
    committed: dict[int, bytes] = {}
    accepted: dict[int, tuple[int, bytes]] = {}
    for rec in scans[REG_ORDER].records:
        kind, x = rec[:1], struct.unpack_from("<Q", rec, 1)[0]
        if kind == b"A":
            accepted[x] = (struct.unpack_from("<Q", rec, 9)[0], rec[17:])
        elif kind == b"C":
            committed[x] = rec[9:]
    acks: list[Ack] = []
    epoch = 0
    for rec in scans[REG_CLIENT].records:
        if rec[:1] == b"R" and len(rec) == 5:
            epoch = struct.unpack_from("<I", rec, 1)[0]
        elif rec[:1] == b"H" and len(rec) == 9:
            pass                         # seq reservation
        elif rec[:1] == b"A" and len(rec) == 33:
            client, seq, gsn, shard, h = struct.unpack_from("<IQQIQ", rec, 1)
            acks.append(Ack(client, seq, gsn, shard, h, epoch))
        else:
            problems.append(f"{p} client journal: undecodable record")
    return NodeDisk(p, node, nnodes, scans[REG_OWN].records,
                    scans[REG_BACKUP].records, committed, accepted, acks,
                    problems)


@dataclass
class View:
    """sl_common.c's view: the state derived from the committed log."""

    nservers: int
    cuts: list[tuple[int, int, list[int]]] = field(default_factory=list)
    active: set[int] = field(default_factory=set)
    final_slot: dict[int, int] = field(default_factory=dict)
    trim: int = 0
    last_slot: int = 0

    @property
    def total(self) -> int:
        return sum(self.cuts[-1][2]) if self.cuts else 0

    def apply(self, slot: int, val: bytes) -> str | None:
        """Applies one command; returns a monotonicity problem, if any."""
        problem = None
        cmd = val[0]
        if cmd == CMD_CUT:
            n = struct.unpack_from("<I", val, 1)[0]
            vec = list(struct.unpack_from(f"<{n}Q", val, 5))
            prev = self.cuts[-1][2] if self.cuts else [0] * n
            for i in range(n):
                shard = i // 2
                if vec[i] < prev[i]:
                    problem = f"slot {slot}: server {i} goes back {prev[i]} -> {vec[i]}"
                elif vec[i] != prev[i] and shard not in self.active:
                    problem = f"slot {slot}: server {i} counts before shard {shard} was added"
                elif vec[i] != prev[i] and shard in self.final_slot and \
                        slot >= self.final_slot[shard]:
                    problem = f"slot {slot}: finalized shard {shard} still grows"
            self.cuts.append((slot, self.total, vec))
        elif cmd == CMD_ADD_SHARD:
            self.active.add(struct.unpack_from("<I", val, 1)[0])
        elif cmd == CMD_FINALIZE:
            shard, eff = struct.unpack_from("<IQ", val, 1)
            self.final_slot.setdefault(shard, eff)
        elif cmd == CMD_TRIM:
            self.trim = max(self.trim, struct.unpack_from("<Q", val, 1)[0])
        self.last_slot = slot
        return problem

    def order(self) -> list[tuple[int, int]]:
        """(server, index) of every gsn, in gsn order (section 3.3.1)."""
        out: list[tuple[int, int]] = []
        prev = [0] * self.nservers
        for _slot, _base, vec in self.cuts:
            for i in range(self.nservers):       # lower shard, lower server first
                out += [(i, j) for j in range(prev[i], vec[i])]
            prev = vec
        return out


@dataclass
class Verdict:
    violations: dict[str, list[str]] = field(
        default_factory=lambda: {c: [] for c in CHECKS})
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def failed(self) -> list[str]:
        return [c for c in CHECKS if self.violations[c]]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed(), "stats": self.stats,
                "checks": {c: {"ok": not v, "violations": len(v),
                               "examples": v[:20]}
                           for c, v in self.violations.items()}}


def check_disks(paths: Iterable[str | Path], live: str | None = None) -> Verdict:
    disks = [read_disk(p) for p in paths]
    if not disks:
        raise LogCheckError("no disks given")
    nnodes = disks[0].nnodes
    by_node = {d.node: d for d in disks}
    if len(by_node) != len(disks) or any(d.nnodes != nnodes for d in disks):
        raise LogCheckError("disks of one store, each node once, please")
    missing = sorted(set(range(nnodes)) - set(by_node))
    if missing:
        raise LogCheckError(f"disks of nodes {missing} are missing "
                            f"(store has {nnodes} nodes)")
    v = Verdict()
    for d in disks:
        v.violations["replay_clean"] += d.problems

    # the cut log: replicas agree, and together hold a gap-free log
    replicas = [by_node[j] for j in range(min(NORDER, nnodes))]
    log: dict[int, bytes] = {}
    for r in replicas:
        for slot, val in r.committed.items():
            if slot in log and log[slot] != val:
                v.violations["cut_log_agrees"].append(
                    f"slot {slot}: replica {r.node} committed another value")
            log.setdefault(slot, val)
    top = max(log, default=0)
    holes = [s for s in range(1, top + 1) if s not in log]
    if holes:
        v.violations["cut_log_agrees"].append(
            f"committed log has holes at slots {holes[:10]}")
    view = View(nnodes)
    for slot in range(1, top + 1):
        if slot not in log:
            break
        problem = view.apply(slot, log[slot])
        if problem:
            v.violations["cuts_monotonic"].append(problem)

    # segments: both replicas hold every record up to the cut, identically
    latest = view.cuts[-1][2] if view.cuts else [0] * nnodes
    segment: dict[int, list[bytes]] = {}
    for i in range(nnodes):
        prim, back = by_node[i].own, by_node[i ^ 1].backup
        n = latest[i]
        if len(prim) < n or len(back) < n:
            v.violations["no_holes"].append(
                f"segment {i}: cut says {n} records, primary holds "
                f"{len(prim)}, backup holds {len(back)}")
        for j in range(min(n, len(prim), len(back))):
            if prim[j] != back[j]:
                v.violations["no_holes"].append(
                    f"segment {i} record {j}: primary and backup differ")
                break
        segment[i] = prim if len(prim) >= len(back) else back

    order = view.order()
    where: dict[tuple[int, int], int] = {}
    for gsn, (i, j) in enumerate(order):
        if gsn < view.trim:
            continue
        if j >= len(segment[i]):
            v.violations["no_holes"].append(f"gsn {gsn}: no record (segment {i} index {j})")
            continue
        rec = segment[i][j]
        client, seq = struct.unpack_from("<IQ", rec)
        if rec != payload(client, seq):
            v.violations["no_phantoms"].append(
                f"gsn {gsn}: record is not what client {client} appends as seq {seq}")
        elif (client, seq) in where:
            v.violations["no_phantoms"].append(
                f"gsn {gsn}: client {client} seq {seq} already at gsn {where[(client, seq)]}")
        else:
            where[(client, seq)] = gsn

    acks = [a for d in disks for a in d.acks]
    for a in acks:
        expect = payload(a.client, a.seq)
        if a.gsn < view.trim:
            continue
        if fnv64(expect) != a.hash:
            v.violations["acked_present"].append(
                f"client {a.client} seq {a.seq}: journal hash is not the payload's")
            continue
        g = where.get((a.client, a.seq))
        if g is None:
            v.violations["acked_present"].append(
                f"client {a.client} seq {a.seq} acked at gsn {a.gsn} is not "
                f"in the ordered log (it ends at {len(order)})")
            continue
        shard = order[g][0] // 2
        if g != a.gsn or shard != a.shard:
            v.violations["gsn_deterministic"].append(
                f"client {a.client} seq {a.seq}: acked as gsn {a.gsn} shard "
                f"{a.shard}, recomputed gsn {g} shard {shard}")
    by_client: dict[int, list[Ack]] = defaultdict(list)
    for a in acks:
        by_client[a.client].append(a)
    for c, lst in by_client.items():
        lst.sort(key=lambda a: a.seq)
        for x, y in itertools.pairwise(lst):
            if y.gsn <= x.gsn:
                v.violations["ack_order"].append(
                    f"client {c}: seq {y.seq} (gsn {y.gsn}) was issued after "
                    f"seq {x.seq} was acked at gsn {x.gsn}")
        latest_epoch = max(a.epoch for a in lst)
        if latest_epoch > 1:
            old = [a.gsn for a in acks if a.epoch < latest_epoch]
            new = [a.gsn for a in lst if a.epoch == latest_epoch]
            if old and new and min(new) <= max(old):
                v.violations["restart_gsns_higher"].append(
                    f"client {c}: after restart (epoch {latest_epoch}) gsn "
                    f"{min(new)} is not above the old maximum {max(old)}")
    v.stats = {"nodes": nnodes, "slots": top, "cuts": len(view.cuts),
               "ordered": len(order), "trim": view.trim,
               "acked": len(acks), "shards_active": len(view.active),
               "finalized": sorted(view.final_slot)}
    if live:
        _check_live(v, live, acks, view.trim)
    return v


# ---- live: subscribe through a running storage server of every shard ----

def _call(addr: str, typ: int, a: int = 0, b: int = 0, c: int = 0,
          timeout: float = 10.0) -> tuple[tuple[int, ...], bytes]:
    host, port = addr.rsplit(":", 1)
    body = MSG.pack(typ, 0, a, b, c, 0, 0)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack("<I", len(body)) + body)
        n = struct.unpack("<I", _recv(s, 4))[0]
        rep = _recv(s, n)
    return MSG.unpack_from(rep), rep[MSG.size:]


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise LogCheckError("connection closed by the storage server")
        out += chunk
    return out


def subscribe(peers: list[str], start: int, end: int) -> dict[int, bytes]:
    """subscribe(start) on one server of every shard, up to gsn end."""
    got: dict[int, bytes] = {}
    for shard in range(len(peers) // 2):
        addr = peers[2 * shard]
        g = start
        while g < end:
            (_t, st, _a, nxt, _total, _trim, _n), data = _call(addr, SL_SUBSCRIBE, b=g, c=1000)
            if st != 0:
                raise LogCheckError(f"subscribe({g}) at {addr}: status {st}")
            pos = 0
            while pos + 12 <= len(data):
                gsn, ln = struct.unpack_from("<QI", data, pos)
                got[gsn] = data[pos + 12:pos + 12 + ln]
                pos += 12 + ln
            if nxt <= g:
                break
            g = nxt
    return got


def _check_live(v: Verdict, live: str, acks: list[Ack], trim: int) -> None:
    peers = [p.strip() for p in live.split(",") if p.strip()]
    try:
        totals = [_call(p, SL_STATUS)[0][3] for p in peers]
        live_trim = _call(peers[0], SL_STATUS)[0][5]
        end = min(totals)
        start = max(trim, live_trim)
        got = subscribe(peers, start, end)
    except OSError as e:
        raise LogCheckError(f"live: {e}") from e
    missing = [g for g in range(start, end) if g not in got]
    if missing:
        v.violations["no_holes"].append(
            f"live: subscribe({start}) misses gsns {missing[:10]} below {end}")
    for a in acks:
        if start <= a.gsn < end:
            rec = got.get(a.gsn)
            if rec is None or fnv64(rec) != a.hash:
                v.violations["acked_present"].append(
                    f"live: client {a.client} seq {a.seq} is not at gsn {a.gsn}")
    v.stats["live_total"] = end
