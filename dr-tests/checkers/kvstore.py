"""Recovery checker for cp-kvstore (a compact ZHT, seeds/003 Chapter 2).

It reads the raw disks of every node (files, or block devices), replays
each partition replica and each client journal exactly as the store
does, reconciles the replicas the way a cold restart does, and checks:

- replay_clean: every log replays cleanly; only a torn tail is allowed.
- acked_survives: every acknowledged mutation is visible, or superseded
  by a later operation of the same client that is present.
- no_value_without_intent: every record on any replica has an intent
  with the same op id, key and value in its client's journal.
- dependent_order: if a client's operation n is visible anywhere, every
  earlier operation of that client that succeeded (or whose reply is not
  in the journal) is visible or superseded, across partitions and nodes.
- replicas_differ_only_unacked: a primary and its synchronous secondary
  differ only by operations that were not acknowledged.
- digests_agree: after reconciliation both replicas of every partition
  have the same digest (and, live, the running servers report it).

See dr-tests/workloads/kvstore/README.md for the layout and the paper
sections.  Everything is little-endian.
"""

from __future__ import annotations

import re
import socket
import struct
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.checkers.rawlog import scan_region

SB_SIZE = 4096
SB_MAGIC = b"CPKVDSK1"
REC = struct.Struct("<QQB3xII")          # seq, opid, kind, klen, vlen
JREC = struct.Struct("<cBBxQQIIII4x")     # type, op, status, opid, seq, part,
#                                           klen, vlen, v2len
PUT, DEL, APPEND = 1, 2, 3
OP_INSERT, OP_LOOKUP, OP_REMOVE, OP_APPEND, OP_CSWAP, OP_CALLBACK = range(1, 7)
OP_DIGEST = 7
MUTATIONS = {OP_INSERT, OP_REMOVE, OP_APPEND, OP_CSWAP}
OK, UNKNOWN = 0, 7
STATUS = {0: "OK", 1: "NOTFOUND", 2: "MISMATCH", 3: "TIMEOUT",
          4: "WRONG_EPOCH", 5: "ERROR", 6: "NOT_OWNER", 7: "UNKNOWN"}
CHECKS = ["replay_clean", "acked_survives", "no_value_without_intent",
          "dependent_order", "replicas_differ_only_unacked", "digests_agree"]
CLIENT_SHIFT = 40
MASK64 = (1 << 64) - 1
TOKEN = re.compile(rb"(\d+)\.(\d+);")


class KvCheckError(Exception):
    """An input could not be read or is not a cp-kvstore disk."""


def fnv64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


@dataclass
class Entry:
    seq: int
    opid: int
    dead: bool
    value: bytes


@dataclass
class Replica:
    node: int
    part: int
    state: dict[bytes, Entry] = field(default_factory=dict)
    history: list[tuple[int, int, int, bytes, bytes]] = field(default_factory=list)
    last: int = 0

    def take(self, seq: int, opid: int, kind: int, key: bytes, val: bytes) -> None:
        """kv_part.c apply(): newer seq wins; APPEND concatenates."""
        e = self.state.get(key)
        if e is not None and seq <= e.seq:
            return
        if kind == APPEND and e is not None and not e.dead:
            nv = e.value + val
        elif kind == DEL:
            nv = b""
        else:
            nv = val
        self.state[key] = Entry(seq, opid, kind == DEL, nv)
        self.last = max(self.last, seq)

    def digest(self) -> int:
        d = 0
        for k, e in self.state.items():
            if not e.dead:
                d = (d + fnv64(k + b"\0" + e.value)) & MASK64
        return d

    def copy(self) -> Replica:
        r = Replica(self.node, self.part, dict(self.state), [], self.last)
        return r


@dataclass
class Op:
    client: int
    n: int
    op: int
    key: bytes
    val: bytes
    val2: bytes
    status: int | None = None        # None: no ack record
    seq: int = 0


@dataclass
class Disk:
    path: str
    node: int
    nparts: int
    nnodes: int
    region_size: int
    epoch: int
    members: list[str]
    replicas: dict[int, Replica]
    ops: dict[int, Op]               # this node's client journal, by n
    problems: list[str]


def _parse_superblock(path: str, sb: bytes) -> tuple[int, int, int, int, int, list[str]]:
    if sb[:8] != SB_MAGIC:
        raise KvCheckError(f"{path}: not a cp-kvstore disk (magic {sb[:8]!r})")
    import zlib
    if zlib.crc32(sb[:SB_SIZE - 4]) != struct.unpack_from("<I", sb, SB_SIZE - 4)[0]:
        raise KvCheckError(f"{path}: superblock checksum mismatch")
    _ver, node, nparts, nnodes = struct.unpack_from("<IIII", sb, 8)
    region_size, epoch = struct.unpack_from("<QQ", sb, 24)
    members = []
    for i in range(nnodes):
        e = sb[64 + 32 * i:96 + 32 * i]
        host = e[:24].split(b"\0")[0].decode()
        members.append(f"{host}:{struct.unpack_from('<I', e, 24)[0]}")
    return node, nparts, nnodes, region_size, epoch, members


def read_disk(path: str | Path) -> Disk:
    """Replays one node's disk: its partition replicas and client journal."""
    p = str(path)
    try:
        with open(p, "rb") as f:
            sb = f.read(SB_SIZE)
            if len(sb) < SB_SIZE:
                raise KvCheckError(f"{p}: too short for a superblock")
            node, nparts, nnodes, rsize, epoch, members = _parse_superblock(p, sb)
            regions = []
            for r in range(nparts + 1):
                f.seek(SB_SIZE + r * rsize)
                regions.append(f.read(rsize))
    except OSError as e:
        raise KvCheckError(f"{p}: {e}") from e
    problems: list[str] = []
    replicas: dict[int, Replica] = {}
    for part in range(nparts):
        primary, secondary = part % nnodes, (part + 1) % nnodes if nnodes > 1 else -1
        if node not in (primary, secondary):
            continue
        scan = scan_region(regions[part], 2)
        problems += [f"{p} partition {part}: {x}" for x in scan.problems]
        rep = Replica(node, part)
        for i, rec in enumerate(scan.records):
            try:
                seq, opid, kind, klen, vlen = REC.unpack_from(rec)
                if REC.size + klen + vlen != len(rec) or kind not in (PUT, DEL, APPEND):
                    raise ValueError("bad lengths or kind")
            except (struct.error, ValueError) as e:
                problems.append(f"{p} partition {part} record {i}: undecodable ({e})")
                continue
            key = rec[REC.size:REC.size + klen]
            val = rec[REC.size + klen:]
            rep.history.append((seq, opid, kind, key, val))
            rep.take(seq, opid, kind, key, val)
        replicas[part] = rep
    ops: dict[int, Op] = {}
    scan = scan_region(regions[nparts], 1)
    problems += [f"{p} client journal: {x}" for x in scan.problems]
    for i, rec in enumerate(scan.records):
        try:
            typ, op, status, opid, seq, _part, klen, vlen, v2len = JREC.unpack_from(rec)
            if JREC.size + klen + vlen + v2len != len(rec):
                raise ValueError("bad lengths")
        except (struct.error, ValueError) as e:
            problems.append(f"{p} client journal record {i}: undecodable ({e})")
            continue
        client, n = opid >> CLIENT_SHIFT, opid & ((1 << CLIENT_SHIFT) - 1)
        body = rec[JREC.size:]
        if typ == b"I":
            ops[n] = Op(client, n, op, body[:klen], body[klen:klen + vlen],
                        body[klen + vlen:])
        elif typ == b"A" and n in ops:
            ops[n].status, ops[n].seq = status, seq
    return Disk(p, node, nparts, nnodes, rsize, epoch, members, replicas, ops,
                problems)


def reconcile(prim: Replica, sec: Replica) -> tuple[Replica, Replica]:
    """What kv_server.c reconcile() does on a cold restart."""
    p2, s2 = prim.copy(), sec.copy()
    p_last, s_last = prim.last, sec.last
    for k, e in sec.state.items():
        if e.seq > p_last:
            p2.take(e.seq, e.opid, DEL if e.dead else PUT, k, e.value)
    for k, e in p2.state.items():
        if e.seq > s_last:
            s2.take(e.seq, e.opid, DEL if e.dead else PUT, k, e.value)
    return p2, s2


@dataclass
class Verdict:
    violations: dict[str, list[str]] = field(
        default_factory=lambda: {c: [] for c in CHECKS})
    stats: dict[str, Any] = field(default_factory=dict)
    digests: dict[int, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def failed(self) -> list[str]:
        return [c for c in CHECKS if self.violations[c]]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed(), "stats": self.stats,
                "checks": {c: {"ok": not v, "violations": len(v),
                               "examples": v[:20]}
                           for c, v in self.violations.items()},
                "digests": {str(k): f"{v:016x}" for k, v in self.digests.items()}}


def _effect_present(op: Op, state: dict[bytes, Entry]) -> tuple[bool, str]:
    """Is op visible, or superseded by a later op of its client?"""
    e = state.get(op.key)
    if op.op == OP_APPEND:
        token = f"{op.client}.{op.n};".encode()
        if e is not None and not e.dead and token in e.value:
            return True, ""
        return False, f"token {token.decode()} missing from {op.key.decode()}"
    if e is None:
        return False, f"key {op.key.decode()} absent"
    en = e.opid & ((1 << CLIENT_SHIFT) - 1)
    ec = e.opid >> CLIENT_SHIFT
    if ec != op.client:
        return False, f"key {op.key.decode()} last written by client {ec}"
    if en > op.n:
        return True, ""
    if en < op.n:
        return False, (f"key {op.key.decode()} holds op {en} (seq {e.seq}), "
                       f"older than op {op.n}")
    want_dead = op.op == OP_REMOVE
    want = op.val2 if op.op == OP_CSWAP else op.val
    if e.dead != want_dead or (not want_dead and e.value != want):
        return False, f"key {op.key.decode()} holds op {en} with another value"
    return True, ""


def _present_ops(state: dict[bytes, Entry]) -> Iterable[tuple[int, int, bytes, Entry]]:
    """(client, n, key, entry) for every op id visible in a state,
    including every append token."""
    for k, e in state.items():
        yield e.opid >> CLIENT_SHIFT, e.opid & ((1 << CLIENT_SHIFT) - 1), k, e
        if not e.dead:
            for m in TOKEN.finditer(e.value):
                yield int(m.group(1)), int(m.group(2)), k, e


def check_disks(paths: Iterable[str | Path]) -> Verdict:
    disks = [read_disk(p) for p in paths]
    if not disks:
        raise KvCheckError("no disks given")
    v = Verdict()
    nparts, nnodes = disks[0].nparts, disks[0].nnodes
    by_node: dict[int, Disk] = {}
    for d in disks:
        if (d.nparts, d.nnodes) != (nparts, nnodes):
            raise KvCheckError(f"{d.path}: belongs to another store layout")
        if d.node in by_node:
            raise KvCheckError(f"{d.path}: node {d.node} given twice")
        by_node[d.node] = d
        v.violations["replay_clean"] += d.problems
    missing = sorted(set(range(nnodes)) - set(by_node))
    if missing:
        raise KvCheckError(f"disks of nodes {missing} are missing "
                           f"(store has {nnodes} nodes)")
    ops: dict[int, dict[int, Op]] = {d.node + 1: d.ops for d in disks}
    served: dict[bytes, Entry] = {}
    for part in range(nparts):
        prim = by_node[part % nnodes].replicas[part]
        if nnodes > 1:
            sec = by_node[(part + 1) % nnodes].replicas[part]
            _compare_replicas(v, part, prim, sec, ops)
            p2, s2 = reconcile(prim, sec)
            if p2.digest() != s2.digest():
                v.violations["digests_agree"].append(
                    f"partition {part}: digests differ after reconciliation "
                    f"({p2.digest():016x} vs {s2.digest():016x})")
            prim = p2
        v.digests[part] = prim.digest()
        served.update(prim.state)
        for rep in (by_node[part % nnodes].replicas[part],
                    by_node[(part + 1) % nnodes].replicas[part]):
            _check_intents(v, rep, ops)
    acked = 0
    for c, cops in ops.items():
        for op in cops.values():
            if op.op in MUTATIONS and op.status == OK:
                acked += 1
                good, why = _effect_present(op, served)
                if not good:
                    v.violations["acked_survives"].append(
                        f"client {c} op {op.n} ({_opname(op.op)}) acked at "
                        f"seq {op.seq}: {why}")
    # dependent-write order, per client
    highest: dict[int, int] = defaultdict(int)
    for c, n, _k, _e in _present_ops(served):
        highest[c] = max(highest[c], n)
    for c, top in highest.items():
        for op in ops.get(c, {}).values():
            if op.n >= top or op.op not in MUTATIONS:
                continue
            if op.status is not None and op.status != OK:
                continue
            good, why = _effect_present(op, served)
            if not good:
                v.violations["dependent_order"].append(
                    f"client {c} op {op.n} ({_opname(op.op)}) is lost but its "
                    f"later op {top} is visible: {why}")
    v.stats = {
        "nodes": nnodes, "partitions": nparts,
        "intents": sum(len(o) for o in ops.values()),
        "acked_mutations": acked,
        "unknown_outcome": sum(1 for o in ops.values() for x in o.values()
                               if x.status in (None, UNKNOWN, 5)),
        "keys": sum(1 for e in served.values() if not e.dead),
        "records": sum(len(r.history) for d in disks for r in d.replicas.values()),
    }
    return v


def _opname(op: int) -> str:
    return {1: "insert", 2: "lookup", 3: "remove", 4: "append", 5: "cswap",
            6: "callback"}.get(op, str(op))


def _compare_replicas(v: Verdict, part: int, prim: Replica, sec: Replica,
                      ops: dict[int, dict[int, Op]]) -> None:
    low = min(prim.last, sec.last)
    for k in set(prim.state) | set(sec.state):
        a, b = prim.state.get(k), sec.state.get(k)
        if a == b:
            continue
        newer = a if b is None or (a is not None and a.seq > b.seq) else b
        assert newer is not None
        where = "primary" if newer is a else "secondary"
        if newer.seq <= low:
            v.violations["replicas_differ_only_unacked"].append(
                f"partition {part} key {k.decode()}: replicas disagree at seq "
                f"{newer.seq}, below both logs' ends ({prim.last}, {sec.last})")
            continue
        c, n = newer.opid >> CLIENT_SHIFT, newer.opid & ((1 << CLIENT_SHIFT) - 1)
        op = ops.get(c, {}).get(n)
        if op is not None and op.status == OK:
            v.violations["replicas_differ_only_unacked"].append(
                f"partition {part} key {k.decode()}: acknowledged op {c}.{n} "
                f"(seq {newer.seq}) only on the {where}")


def _check_intents(v: Verdict, rep: Replica, ops: dict[int, dict[int, Op]]) -> None:
    for seq, opid, kind, key, val in rep.history:
        c, n = opid >> CLIENT_SHIFT, opid & ((1 << CLIENT_SHIFT) - 1)
        where = f"node {rep.node} partition {rep.part} seq {seq}"
        if key.startswith(f"c{c}a".encode()) and kind in (PUT, APPEND):
            # an append key (compacted: the whole list): every token
            for m in TOKEN.finditer(val):
                tc, tn = int(m.group(1)), int(m.group(2))
                op = ops.get(tc, {}).get(tn)
                if op is None or op.op != OP_APPEND or op.key != key:
                    v.violations["no_value_without_intent"].append(
                        f"{where}: token {tc}.{tn} in {key.decode()} has no "
                        f"append intent")
            continue
        op = ops.get(c, {}).get(n)
        if op is None:
            v.violations["no_value_without_intent"].append(
                f"{where}: op {c}.{n} on {key.decode()} has no intent")
            continue
        want = {DEL: (OP_REMOVE,), PUT: (OP_INSERT, OP_CSWAP)}.get(kind, ())
        good = op.key == key and op.op in want and (
            kind == DEL or val == (op.val2 if op.op == OP_CSWAP else op.val))
        if not good:
            v.violations["no_value_without_intent"].append(
                f"{where}: op {c}.{n} on {key.decode()} does not match its "
                f"intent ({_opname(op.op)} on {op.key.decode()})")


# ---- live checks against running servers ----

def _call(addr: str, op: int, opid: int, timeout: float = 10.0) -> tuple[int, int, bytes]:
    host, port = addr.rsplit(":", 1)
    body = struct.pack("<B3xIQIIII", op, 0, opid, 0, 0, 0, 0)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack("<I", len(body)) + body)
        hdr = _recv(s, 4)
        rep = _recv(s, struct.unpack("<I", hdr)[0])
    status, _epoch, seq, vlen = struct.unpack_from("<B3xIQI", rep)
    return status, seq, rep[20:20 + vlen]


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise KvCheckError("connection closed by the server")
        out += chunk
    return out


def live_digests(peers: list[str], nparts: int) -> dict[int, tuple[int, int]]:
    """Asks both replicas of every partition for (last seq, digest);
    returns {part: (primary digest, secondary digest)}."""
    out: dict[int, tuple[int, int]] = {}
    n = len(peers)
    for part in range(nparts):
        got = []
        for node in (part % n, (part + 1) % n):
            try:
                st, _seq, val = _call(peers[node], OP_DIGEST, part)
            except OSError as e:
                raise KvCheckError(f"DIGEST {part} to {peers[node]}: {e}") from e
            if st != OK or len(val) != 8:
                raise KvCheckError(f"DIGEST {part} to {peers[node]}: status "
                                   f"{STATUS.get(st, st)}, {len(val)} bytes")
            got.append(struct.unpack("<Q", val)[0])
        out[part] = (got[0], got[1])
    return out


def check_live(peers: list[str], nparts: int, expect: Verdict | None = None) -> Verdict:
    """Live: after the store came up again, both replicas of every
    partition report the same digest; with expect (an offline verdict of
    the same disks, taken before any new write), that digest too."""
    v = expect if expect is not None else Verdict()
    for part, (a, b) in live_digests(peers, nparts).items():
        if a != b:
            v.violations["digests_agree"].append(
                f"partition {part}: live digests differ ({a:016x} vs {b:016x})")
        if expect is not None and part in expect.digests and expect.digests[part] != a:
            v.violations["digests_agree"].append(
                f"partition {part}: live digest {a:016x} is not the offline "
                f"reconciled digest {expect.digests[part]:016x}")
        v.digests[part] = a
    return v
