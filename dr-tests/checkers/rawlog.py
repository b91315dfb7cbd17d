"""Reader for the raw-disk record logs of cp-kvstore and cp-sharedlog.

The format is written by `dr-tests/workloads/kvstore/rlog.c`:

    region = half 0 [| half 1]
    half   = header (512 bytes) | record | record | ... | garbage
    header = u32 'CPHL' | u32 gen | u32 nonce | u32 crc32(first 12 bytes)
    record = u32 'CPRC' | u32 nonce | u32 len | u32 crc | payload, padded
             to 8 bytes; crc = crc32(nonce, len, payload)

The live half is the valid header with the highest gen.  Replay stops at
the first record that does not validate; that is allowed only as the
torn tail.  A valid record of the same nonce *after* that point means a
record in the middle of the log was lost or damaged: replay is not clean.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

HDR = 512
REC_HDR = 16
HDR_MAGIC = 0x4C484043
REC_MAGIC = 0x43524350
U32 = struct.Struct("<I")
HALF_HDR = struct.Struct("<IIII")


@dataclass
class Scan:
    """One region's replay: the records, and what replay ran into."""

    records: list[bytes] = field(default_factory=list)
    formatted: bool = False          # some half had a valid header
    half: int = 0
    gen: int = 0
    tail: int = 0                    # offset of the end of the log in the half
    torn: bool = False               # non-zero bytes at the tail
    problems: list[str] = field(default_factory=list)


def _rec_crc(nonce: int, length: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<II", nonce, length)))


def _valid_at(buf: bytes, pos: int, nonce: int) -> int:
    """Length of the valid record at pos, or -1."""
    if pos + REC_HDR > len(buf):
        return -1
    magic, rn, length, crc = HALF_HDR.unpack_from(buf, pos)
    if magic != REC_MAGIC or rn != nonce or length > len(buf) - pos - REC_HDR:
        return -1
    payload = buf[pos + REC_HDR:pos + REC_HDR + length]
    return length if _rec_crc(nonce, length, payload) == crc else -1


def scan_region(data: bytes, nhalves: int) -> Scan:
    """Replays one region (the bytes of the whole region)."""
    half = (len(data) // nhalves) & ~511
    best: tuple[int, int, int] | None = None   # gen, half, nonce
    for h in range(nhalves):
        magic, gen, nonce, crc = HALF_HDR.unpack_from(data, h * half)
        valid = magic == HDR_MAGIC and \
            zlib.crc32(data[h * half:h * half + 12]) == crc
        if valid and (best is None or gen > best[0]):
            best = (gen, h, nonce)
    scan = Scan()
    if best is None:
        return scan
    gen, h, nonce = best
    scan.formatted, scan.half, scan.gen = True, h, gen
    buf = data[h * half:(h + 1) * half]
    pos = HDR
    while True:
        length = _valid_at(buf, pos, nonce)
        if length < 0:
            break
        scan.records.append(buf[pos + REC_HDR:pos + REC_HDR + length])
        pos += (REC_HDR + length + 7) & ~7
    scan.tail = pos
    scan.torn = any(buf[pos:pos + REC_HDR])
    # Anything valid beyond the stop point is a lost middle record.
    magic = U32.pack(REC_MAGIC)
    probe = buf.find(magic, pos + 1)
    while probe >= 0:
        if probe % 8 == 0 and _valid_at(buf, probe, nonce) >= 0:
            scan.problems.append(
                f"record at half offset {pos} does not validate but a valid "
                f"record follows at {probe}: damage in the middle of the log")
            break
        probe = buf.find(magic, probe + 1)
    return scan


def encode_record(nonce: int, payload: bytes) -> bytes:
    """One record as rlog.c writes it (for tests)."""
    rec = struct.pack("<IIII", REC_MAGIC, nonce, len(payload),
                      _rec_crc(nonce, len(payload), payload)) + payload
    return rec + bytes(-len(rec) % 8)
