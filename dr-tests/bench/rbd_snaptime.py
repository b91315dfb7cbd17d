"""Time `rbd_snap_create` on an image opened in advance (librbd, one client).

Run with the system Python, which has Debian's python3-rbd bindings (the
project's virtualenv does not):

    /usr/bin/python3 rbd_snaptime.py CONF ID KEYRING POOL IMAGE ROUNDS

Prints one JSON object: {"image", "size", "snap_ms": [...]}.  The snapshots
it creates are removed again (outside the timed section).  Kept free of
project imports on purpose.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import rados
    import rbd
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    conf, client_id, keyring, pool, image, rounds = argv
    cluster = rados.Rados(conffile=conf, rados_id=client_id,
                          conf={"keyring": keyring})
    cluster.connect(timeout=30)
    try:
        ioctx = cluster.open_ioctx(pool)
        try:
            with rbd.Image(ioctx, image) as img:
                times = []
                names = []
                for i in range(int(rounds)):
                    name = f"bench.snaptime.{i}"
                    t0 = time.perf_counter()
                    img.create_snap(name)
                    times.append((time.perf_counter() - t0) * 1000.0)
                    names.append(name)
                for name in names:
                    img.remove_snap(name)
                size = img.size()
        finally:
            ioctx.close()
    finally:
        cluster.shutdown()
    print(json.dumps({"image": f"{pool}/{image}", "size": size, "snap_ms": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
