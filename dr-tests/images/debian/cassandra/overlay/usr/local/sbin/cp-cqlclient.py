"""Shared by cp-writer and cp-check: the node's address, the operation log
and a driver session (Debian's python3-cassandra, the DataStax driver).

Operation log (GCVM section 4.5.3): on the commit-log disk, one record per
write acknowledged at consistency level ALL, appended only after the ack,
opened O_DSYNC so a record is on the disk before the next write starts:

    "%015d %016x\\n"   (33 bytes: write number, the unique value written)
"""

import os
import re
import sys
import time

OPLOG = os.environ.get("CP_OPLOG", "/srv/clog/oplog")
REC = 33
_REC_RX = re.compile(rb"^(\d{15}) ([0-9a-f]{16})\n$")


def cmdline_arg(name, default=""):
    try:
        with open("/proc/cmdline") as f:
            text = f.read()
    except OSError:
        text = ""
    m = re.search(rf"\b{re.escape(name)}=(\S+)", text)
    return m.group(1) if m else os.environ.get(name.replace(".", "_").upper(),
                                               default)


def my_ip():
    return cmdline_arg("cp.ip").split("/")[0]


def uptime():
    try:
        return open("/proc/uptime").read().split()[0]
    except OSError:
        return f"{time.monotonic():.2f}"


def say(*words):
    print("CPSTATE", *words, uptime(), flush=True)


def read_oplog(path=OPLOG):
    """-> (records [(n, value)], bad, torn_bytes).  Numbers must be 1, 2, ...;
    a short tail (an append cut by the snapshot) is reported, not counted."""
    recs, bad, torn = [], 0, 0
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return recs, -1, 0
    for off in range(0, len(data), REC):
        chunk = data[off:off + REC]
        if len(chunk) < REC:
            torn = len(chunk)
            break
        m = _REC_RX.match(chunk)
        if not m or int(m.group(1)) != len(recs) + 1:
            bad += 1
            break
        recs.append((int(m.group(1)), m.group(2).decode()))
    return recs, bad, torn


def session(ip, timeout=120.0):
    """A session on this node only, retried until the node answers."""
    from cassandra.cluster import Cluster
    from cassandra.policies import WhiteListRoundRobinPolicy
    deadline = time.monotonic() + 1800
    while True:
        try:
            c = Cluster([ip], protocol_version=4, connect_timeout=60,
                        control_connection_timeout=60,
                        load_balancing_policy=WhiteListRoundRobinPolicy([ip]),
                        schema_metadata_enabled=False,
                        token_metadata_enabled=False,
                        max_schema_agreement_wait=120)
            s = c.connect()
            s.default_timeout = timeout
            return c, s
        except Exception as e:  # NoHostAvailable while Cassandra starts
            if time.monotonic() > deadline:
                raise
            print(f"cp-cql: waiting for {ip}: {str(e)[:200]}",
                  file=sys.stderr, flush=True)
            time.sleep(5)
