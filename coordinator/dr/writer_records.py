"""The writer's records: their format and the proof over a set of disks.

The writer workload (docs/writer.md) appends numbered 512-byte records,
each once, spread over a VM group's disks.  This module reads every disk
of a set (raw files, RBD images or snapshots, qcow2 internal snapshots),
collects every record, and proves that the valid records are exactly the
sequence numbers 1..p, each once, all of one run.  It is the built-in
drill check `writer` (checks.py) and the core of the command-line checker.

It needs no knowledge of where the writer put a record: "read every disk"
is enough, because every record carries its own sequence number and
checksum.

Slot classification (a slot is 512 bytes at a 512-byte aligned offset):

- all zeros: unwritten, ignored;
- magic "CPWR" and a matching CRC-32: a valid record;
- magic present but the CRC field is zero, or the first 32 bytes are zero
  while the rest is not: *torn* (part of the write never landed);
- anything else: *corrupt* (wrong checksum, or data that is not a record).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import threading
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from cutpoint.coordinator.dr.site import CephConnection, CephSite, ImageRef

RECORD_SIZE = 512
MAGIC = b"CPWR"
CRC_OFFSET = 508
HEADER = struct.Struct("<4sIQIIQ")  # magic, epoch, seq, vm, disk, run
CHUNK = 1 << 20
ZERO_CHUNK = bytes(CHUNK)
ZERO_SLOT = bytes(RECORD_SIZE)
ZERO_HEAD = bytes(32)
MAX_LISTED = 20  # anomalies listed per kind; all are counted


class CheckerError(Exception):
    """A source could not be read.  Carries the command and what it said."""

    def __init__(self, message: str, command: list[str] | None = None,
                 stderr: str = "") -> None:
        self.command = command
        self.stderr = stderr
        detail = message
        if command:
            detail += f"\n  command: {' '.join(command)}"
        if stderr:
            detail += f"\n  stderr: {stderr.strip()}"
        super().__init__(detail)


def encode_record(seq: int, epoch: int = 0, vm: int = 1, disk: int = 0,
                  run: int = 1) -> bytes:
    """The 512 bytes the writer writes for these fields (for tests, docs)."""
    head = HEADER.pack(MAGIC, epoch, seq, vm, disk, run)
    body = head + bytes(CRC_OFFSET - len(head))
    return body + struct.pack("<I", zlib.crc32(body))


@dataclass(frozen=True)
class Record:
    seq: int
    epoch: int
    vm: int
    disk: int
    run: int
    source: str
    offset: int


@dataclass(frozen=True)
class Anomaly:
    kind: str  # torn | corrupt | duplicate | foreign-run | mixed-labels
    source: str
    offset: int | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source,
                "offset": self.offset, "detail": self.detail}


@dataclass
class SourceStats:
    name: str
    bytes_read: int = 0
    records: int = 0
    labels: Counter[tuple[int, int]] = field(default_factory=Counter)


@dataclass
class Verdict:
    ok: bool
    p: int  # highest valid sequence number (0: none)
    prefix: int  # largest n such that 1..n are all present
    records: int  # valid records found
    gaps: list[tuple[int, int]]  # missing inclusive ranges within 1..p
    missing: int
    torn: int
    corrupt: int
    duplicates: int
    runs: dict[int, int]
    anomalies: list[Anomaly]
    sources: list[SourceStats]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "p": self.p, "prefix": self.prefix,
            "records": self.records,
            "gaps": [list(g) for g in self.gaps], "missing": self.missing,
            "torn": self.torn, "corrupt": self.corrupt,
            "duplicates": self.duplicates,
            "runs": {str(k): v for k, v in self.runs.items()},
            "anomalies": [a.as_dict() for a in self.anomalies],
            "sources": [{"name": s.name, "bytes": s.bytes_read,
                         "records": s.records,
                         "labels": [{"vm": vm, "disk": d, "records": n}
                                    for (vm, d), n in sorted(s.labels.items())]}
                        for s in self.sources],
        }

    def summary(self) -> str:
        if self.ok:
            return (f"OK: records 1..{self.p} all present, each once "
                    f"({self.records} records on {len(self.sources)} disks)")
        parts = [f"FAILED: p={self.p}, prefix 1..{self.prefix} intact"]
        if self.gaps:
            shown = ", ".join(_fmt_range(g) for g in self.gaps[:MAX_LISTED])
            more = "" if len(self.gaps) <= MAX_LISTED else ", ..."
            parts.append(f"{self.missing} missing in {len(self.gaps)} gaps: "
                         f"{shown}{more}")
        for kind in ("torn", "corrupt", "duplicates"):
            n = getattr(self, kind)
            if n:
                parts.append(f"{n} {kind}")
        if len(self.runs) > 1:
            parts.append(f"records of {len(self.runs)} runs")
        if self.records == 0:
            parts.append("no valid record at all")
        return "; ".join(parts)


def _fmt_range(g: tuple[int, int]) -> str:
    return str(g[0]) if g[0] == g[1] else f"{g[0]}-{g[1]}"


def classify(slot: bytes) -> str:
    """'zero', 'valid', 'torn' or 'corrupt' for one 512-byte slot."""
    if slot == ZERO_SLOT:
        return "zero"
    crc_field = slot[CRC_OFFSET:]
    if slot[:4] == MAGIC:
        if crc_field == b"\0\0\0\0":
            return "torn"
        if struct.unpack("<I", crc_field)[0] == zlib.crc32(slot[:CRC_OFFSET]):
            return "valid"
        return "corrupt"
    if slot[:32] == ZERO_HEAD:
        return "torn"
    return "corrupt"


class Scan:
    """Accumulates the records and anomalies of every source."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.anomalies: list[Anomaly] = []
        self.counts: Counter[str] = Counter()
        self.sources: list[SourceStats] = []

    def merge(self, other: Scan) -> None:
        """Add another scan's findings (sources scanned in parallel)."""
        self.records += other.records
        self.sources += other.sources
        listed = Counter(a.kind for a in self.anomalies)
        for a in other.anomalies:
            if listed[a.kind] < MAX_LISTED:
                self.anomalies.append(a)
                listed[a.kind] += 1
        self.counts.update(other.counts)

    def _note(self, kind: str, source: str, offset: int | None,
              detail: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_LISTED:
            self.anomalies.append(Anomaly(kind, source, offset, detail))

    def add_stream(self, name: str, stream: IO[bytes]) -> SourceStats:
        """Scan one disk image read sequentially from stream."""
        stats = SourceStats(name)
        self.sources.append(stats)
        offset = 0
        pending = b""
        while True:
            data = stream.read(CHUNK)
            if not data:
                break
            if pending:
                data = pending + data
                pending = b""
            usable = len(data) - len(data) % RECORD_SIZE
            if usable < len(data):
                pending = data[usable:]
                data = data[:usable]
            if data != ZERO_CHUNK[:len(data)]:
                self._scan_chunk(stats, data, offset)
            offset += len(data)
        if pending and pending != ZERO_SLOT[:len(pending)]:
            self._note("torn", name, offset,
                       f"{len(pending)} trailing bytes, not a whole record")
        stats.bytes_read = offset + len(pending)
        return stats

    def _scan_chunk(self, stats: SourceStats, data: bytes, base: int) -> None:
        for i in range(0, len(data), RECORD_SIZE):
            slot = data[i:i + RECORD_SIZE]
            kind = classify(slot)
            if kind == "zero":
                continue
            off = base + i
            if kind == "valid":
                _, epoch, seq, vm, disk, run = HEADER.unpack_from(slot)
                self.records.append(Record(seq, epoch, vm, disk, run,
                                           stats.name, off))
                stats.records += 1
                stats.labels[(vm, disk)] += 1
            elif kind == "torn":
                self._note("torn", stats.name, off,
                           "record only partly written")
            else:
                if slot[:4] == MAGIC:
                    seq = HEADER.unpack_from(slot)[2]
                    detail = f"checksum mismatch (header says seq {seq})"
                else:
                    detail = "not a writer record"
                self._note("corrupt", stats.name, off, detail)

    def verdict(self) -> Verdict:
        seqs = Counter(r.seq for r in self.records)
        runs = Counter(r.run for r in self.records)
        dup_total = 0
        by_seq: dict[int, list[Record]] = defaultdict(list)
        for r in self.records:
            if seqs[r.seq] > 1:
                by_seq[r.seq].append(r)
        for seq in sorted(by_seq):
            dup_total += 1
            where = ", ".join(f"{r.source}@{r.offset}" for r in by_seq[seq])
            self._note("duplicate", by_seq[seq][0].source, by_seq[seq][0].offset,
                       f"seq {seq} found {seqs[seq]} times: {where}")
        zero_seq = seqs.get(0, 0)
        if zero_seq:
            self._note("corrupt", "*", None,
                       f"{zero_seq} records with seq 0 (the writer starts at 1)")
        if len(runs) > 1:
            main_run = runs.most_common(1)[0][0]
            for run, n in sorted(runs.items()):
                if run != main_run:
                    first = next(r for r in self.records if r.run == run)
                    self._note("foreign-run", first.source, first.offset,
                               f"{n} records of run {run}, the majority "
                               f"are of run {main_run}")
        self._check_labels()
        p = max(seqs) if seqs else 0
        gaps = _gaps(sorted(s for s in seqs if s > 0), p)
        missing = sum(hi - lo + 1 for lo, hi in gaps)
        prefix = gaps[0][0] - 1 if gaps else p
        ok = (p > 0 and not gaps and dup_total == 0 and zero_seq == 0
              and len(runs) == 1 and not self.counts["torn"]
              and not self.counts["corrupt"]
              and not self.counts["mixed-labels"])
        return Verdict(ok=ok, p=p, prefix=prefix, records=len(self.records),
                       gaps=gaps, missing=missing,
                       torn=self.counts["torn"],
                       corrupt=self.counts["corrupt"], duplicates=dup_total,
                       runs=dict(runs), anomalies=list(self.anomalies),
                       sources=list(self.sources))

    def _check_labels(self) -> None:
        """Every disk holds the records of one (vm, disk) writer slot only,
        and no two disks share one: catches a set of images assembled
        wrongly (the same image twice, images of two different runs)."""
        owner: dict[tuple[int, int], str] = {}
        for s in self.sources:
            if len(s.labels) > 1:
                self._note("mixed-labels", s.name, None,
                           "records of several writer disks: " + ", ".join(
                               f"vm{vm}/disk{d}" for vm, d in sorted(s.labels)))
            for label in s.labels:
                if label in owner and owner[label] != s.name:
                    self._note("mixed-labels", s.name, None,
                               f"vm{label[0]}/disk{label[1]} records also on "
                               f"{owner[label]}")
                owner.setdefault(label, s.name)


def _gaps(sorted_seqs: list[int], p: int) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    expect = 1
    for s in sorted_seqs:
        if s > expect:
            gaps.append((expect, s - 1))
        expect = max(expect, s + 1)
    if p >= expect:
        gaps.append((expect, p))
    return gaps


# ---- sources ---------------------------------------------------------------

class Spec(Protocol):
    """A disk to read: its name in reports, and how to scan it."""

    @property
    def name(self) -> str: ...

    def scan_into(self, scan: Scan) -> None: ...


class _Chunks:
    """A read-only stream over an iterator of byte chunks (for Scan.add_stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def read(self, n: int) -> bytes:
        while len(self._buf) < n:
            nxt = next(self._chunks, None)
            if nxt is None:
                break
            self._buf += nxt
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


@dataclass(frozen=True)
class CephImageSpec:
    """An RBD image or snapshot at a Ceph site, read through site.py."""

    site: CephSite
    ref: ImageRef

    @property
    def name(self) -> str:
        return f"{self.site.name}:{self.ref}"

    def scan_into(self, scan: Scan) -> None:
        with CephConnection(self.site) as ceph:
            chunks = ceph.iter_read(self.ref.pool, self.ref.image, self.ref.snap)
            try:
                scan.add_stream(self.name, _Chunks(chunks))  # type: ignore[arg-type]
            finally:
                chunks.close()


@dataclass(frozen=True)
class Qcow2Spec:
    path: str
    snap: str | None

    @property
    def name(self) -> str:
        return self.path + (f"@{self.snap}" if self.snap else "")

    def scan_into(self, scan: Scan) -> None:
        _scan_qcow2(scan, self)


@dataclass(frozen=True)
class FileSpec:
    path: str

    @property
    def name(self) -> str:
        return self.path

    def scan_into(self, scan: Scan) -> None:
        try:
            with open(self.path, "rb") as f:
                scan.add_stream(self.name, f)
        except OSError as e:
            raise CheckerError(f"{self.path}: {e.strerror}") from e


def scan_process(scan: Scan, name: str, argv: list[str]) -> None:
    """Scan what a command writes to its stdout (a disk exported by a tool)."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as e:
        raise CheckerError(f"cannot run {argv[0]}: {e}", argv) from e
    assert proc.stdout is not None and proc.stderr is not None
    with tempfile.TemporaryFile() as errf:
        # Drain stderr on the side so a chatty tool cannot block us.
        t = threading.Thread(target=shutil.copyfileobj, args=(proc.stderr, errf))
        t.start()
        try:
            scan.add_stream(name, proc.stdout)
        finally:
            proc.stdout.close()
            rc = proc.wait()
            t.join()
        errf.seek(0)
        err = errf.read().decode(errors="replace")
    if rc != 0:
        raise CheckerError(f"reading {name} failed (exit {rc})", argv, err)


def _scan_qcow2(scan: Scan, spec: Qcow2Spec) -> None:
    if not os.path.exists(spec.path):
        raise CheckerError(f"{spec.path}: no such file")
    with tempfile.TemporaryDirectory(prefix="cp-check-") as tmp:
        raw = Path(tmp) / "disk.raw"
        # -U: the image may be open in a running QEMU; an internal snapshot
        # is immutable, so reading it beside the writer is safe.
        argv = ["qemu-img", "convert", "-U", "-f", "qcow2", "-O", "raw"]
        if spec.snap:
            argv += ["-l", f"snapshot.name={spec.snap}"]
        argv += [spec.path, str(raw)]
        res = subprocess.run(argv, check=False, capture_output=True,
                             text=True)
        if res.returncode != 0:
            raise CheckerError(f"reading {spec.name} failed (exit "
                               f"{res.returncode})", argv, res.stderr)
        with open(raw, "rb") as f:
            scan.add_stream(spec.name, f)


def _scan_one(spec: Spec) -> Scan:
    scan = Scan()
    spec.scan_into(scan)
    return scan


def scan_specs(specs: Iterable[Spec], jobs: int = 4) -> Verdict:
    """Read every source (up to `jobs` at a time) and return the verdict."""
    specs = list(specs)
    if jobs > 1 and len(specs) > 1:
        with ThreadPoolExecutor(max_workers=jobs) as ex:
            parts = list(ex.map(_scan_one, specs))
    else:
        parts = [_scan_one(s) for s in specs]
    total = Scan()
    for part in parts:
        total.merge(part)
    return total.verdict()


def check_files(paths: Iterable[str | os.PathLike[str]]) -> Verdict:
    return scan_specs(FileSpec(os.fspath(p)) for p in paths)


def check_streams(streams: Iterable[tuple[str, IO[bytes]]]) -> Verdict:
    scan = Scan()
    for name, stream in streams:
        scan.add_stream(name, stream)
    return scan.verdict()


def iter_records(data: bytes) -> Iterator[tuple[int, str]]:
    """(offset, classification) of every non-zero slot of data (debugging)."""
    for i in range(0, len(data) - len(data) % RECORD_SIZE, RECORD_SIZE):
        kind = classify(data[i:i + RECORD_SIZE])
        if kind != "zero":
            yield i, kind
