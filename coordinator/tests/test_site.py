"""Ceph site access without a cluster: the site description, the typed
errors (from real binding exceptions), the bounded runner, and a connect to
a mon address where nothing listens (real librados, no lab).

The operations themselves run against the lab's clusters in
test_site_lab.py.
"""

from __future__ import annotations

import errno
import subprocess
import threading
import time

import pytest
import rados
import rbd
from cutpoint.coordinator.dr import ceph_errors as CE
from cutpoint.coordinator.dr.site import CephConnection, CephSite, SiteConfigError
from cutpoint.coordinator.dr.site_check import check_site

# A port on loopback where nothing listens: librados keeps dialling until
# client_mount_timeout.
NOWHERE = ("v2:127.0.0.1:1",)


@pytest.fixture(scope="module")
def keyring(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A well-formed keyring for client.cutpoint (no cluster knows its key)."""
    p = tmp_path_factory.mktemp("keyring") / "ceph.client.cutpoint.keyring"
    subprocess.run(["ceph-authtool", "--create-keyring", str(p), "--gen-key", "-n",
                    "client.cutpoint"], check=True, capture_output=True)
    return str(p)


def site(**kw: object) -> CephSite:
    args: dict[str, object] = {"name": "dr", "pools": {"rbd": "rbd"}, "mon_host": NOWHERE}
    args.update(kw)
    return CephSite(**args)  # type: ignore[arg-type]


# -- the site description -----------------------------------------------------
def test_the_default_client_is_not_admin() -> None:
    assert site().client_id == "cutpoint"


@pytest.mark.parametrize("kw, words", [
    ({"mon_host": ()}, "ceph.conf path or mon addresses"),
    ({"mon_host": "v2:1.2.3.4:3300"}, "list of addresses"),
    ({"client_id": "client.admin"}, "without 'client.'"),
    ({"client_id": ""}, "bad cephx client id"),
    ({"client_id": "cut point"}, "bad cephx client id"),
    ({"pools": {}}, "pool map is empty"),
    ({"pools": {"rbd": ""}}, "empty name"),
    ({"op_timeout_s": 0}, "op_timeout_s must be a whole number"),
    ({"connect_timeout_s": 2.5}, "connect_timeout_s must be a whole number"),
    ({"bulk_timeout_s": True}, "bulk_timeout_s must be a whole number"),
    ({"extra": {"key": "AQB..."}}, "by keyring path"),
    ({"name": ""}, "needs a name"),
])
def test_a_site_that_cannot_work_is_refused(kw: dict[str, object], words: str) -> None:
    with pytest.raises(SiteConfigError, match=words):
        site(**kw)


def test_librados_gets_every_deadline_and_only_the_keyring_path() -> None:
    s = site(keyring="/etc/ceph/dr.client.cutpoint.keyring", connect_timeout_s=7,
             op_timeout_s=11, mon_host=("v2:10.0.0.1:3300", "v2:10.0.0.2:3300"))
    conf = s.librados_conf()
    assert conf["client_mount_timeout"] == "7"
    assert conf["rados_mon_op_timeout"] == conf["rados_osd_op_timeout"] == "11"
    assert conf["mon_host"] == "v2:10.0.0.1:3300,v2:10.0.0.2:3300"
    assert conf["keyring"] == "/etc/ceph/dr.client.cutpoint.keyring"
    assert not any(k in conf for k in ("key", "keyfile"))
    assert s.call_bound_s() == 27  # 2 x 11 + 5


def test_extra_settings_cannot_loosen_the_deadlines() -> None:
    conf = site(op_timeout_s=5, extra={"rados_osd_op_timeout": "0"}).librados_conf()
    assert conf["rados_osd_op_timeout"] == "5"


def test_logical_pools_map_to_the_site_pools() -> None:
    s = site(pools={"vms": "dr-vms", "db": "dr-db"})
    assert s.pool("vms") == "dr-vms" and s.pool("db") == "dr-db"
    with pytest.raises(SiteConfigError, match=r"maps no pool 'logs' \(its pools: \['db', 'vms'\]\)"):
        s.pool("logs")


def test_from_mapping_takes_the_one_pool_form_and_the_pool_map() -> None:
    one = CephSite.from_mapping("primary", {"ceph_conf": "/c.conf", "keyring": "/k",
                                            "client_id": "cutpoint", "pool": "rbd"})
    assert one.pools == {"rbd": "rbd"} and one.ceph_conf == "/c.conf" and one.keyring == "/k"
    many = CephSite.from_mapping("dr", {"mon_host": ["v2:10.0.0.3:3300"],
                                        "pools": {"rbd": "rbd-dr"}, "op_timeout_s": 9})
    assert many.mon_host == ("v2:10.0.0.3:3300",) and many.pools == {"rbd": "rbd-dr"}
    assert many.client_id == "cutpoint" and many.op_timeout_s == 9


# -- typed errors, from the bindings' own exception classes ----------------------
@pytest.mark.parametrize("exc, cls, code", [
    (rbd.ImageNotFound("gone", errno=errno.ENOENT), CE.CephNotFound, "ceph_not_found"),
    (rados.ObjectNotFound("no pool", errno=errno.ENOENT), CE.CephNotFound, "ceph_not_found"),
    (rbd.ImageExists("there", errno=errno.EEXIST), CE.CephExists, "ceph_exists"),
    (rbd.PermissionError("caps", errno=errno.EPERM), CE.CephPermissionDenied,
     "ceph_permission_denied"),
    (rados.PermissionDeniedError("caps", errno=errno.EACCES), CE.CephPermissionDenied,
     "ceph_permission_denied"),
    (rbd.Timeout("slow", errno=errno.ETIMEDOUT), CE.CephTimeout, "ceph_timeout"),
    (rados.TimedOut("slow", errno=-errno.ETIMEDOUT), CE.CephTimeout, "ceph_timeout"),
    (rbd.ImageBusy("open", errno=errno.EBUSY), CE.CephError, "ceph_error"),
])
def test_binding_errors_become_typed_errors(exc: Exception, cls: type[CE.CephError],
                                            code: str) -> None:
    err = CE.from_binding(exc, "create snapshot", "rbd/vm1-disk0@cp.g.1", site="dr")
    assert type(err) is cls and err.code == code
    assert err.errno == abs(exc.errno)  # type: ignore[attr-defined]
    assert err.op == "create snapshot" and err.obj == "rbd/vm1-disk0@cp.g.1"
    assert str(err).startswith("site dr: create snapshot rbd/vm1-disk0@cp.g.1: ")
    d = err.as_dict()
    assert d["code"] == code and d["errno"] == err.errno and d["object"] == err.obj


@pytest.mark.parametrize("n, cls", [
    (errno.ETIMEDOUT, CE.CephUnreachable), (errno.ECONNREFUSED, CE.CephUnreachable),
    (errno.EACCES, CE.CephPermissionDenied), (errno.ENOENT, CE.CephNotFound),
    (errno.EIO, CE.CephError),
])
def test_a_failed_connect_is_typed_by_its_errno(n: int, cls: type[CE.CephError]) -> None:
    err = CE.from_binding(rados.Error("connect", errno=n), "connect", "client.cutpoint",
                          connecting=True)
    assert type(err) is cls


def test_the_codes_are_stable() -> None:
    assert {c.__name__: c.code for c in (CE.CephError, CE.CephNotFound, CE.CephExists,
                                         CE.CephPermissionDenied, CE.CephTimeout,
                                         CE.CephUnreachable)} == {
        "CephError": "ceph_error", "CephNotFound": "ceph_not_found",
        "CephExists": "ceph_exists", "CephPermissionDenied": "ceph_permission_denied",
        "CephTimeout": "ceph_timeout", "CephUnreachable": "ceph_unreachable"}


# -- the bounded runner ----------------------------------------------------------
def test_a_call_that_overruns_its_bound_is_abandoned_and_the_session_refused() -> None:
    conn = CephConnection(site())
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(CE.CephTimeout) as ei:
        conn._bounded("list images", "rbd", lambda: release.wait(30), 0.3)
    took = time.monotonic() - t0
    assert 0.3 <= took < 1.5, took
    assert ei.value.errno is None and "call abandoned" in ei.value.detail
    t0 = time.monotonic()
    with pytest.raises(CE.CephTimeout, match="earlier call was abandoned"):
        conn._bounded("list images", "rbd", list, 5)
    assert time.monotonic() - t0 < 0.1
    release.set()


def test_the_runner_types_binding_errors_and_passes_others_through() -> None:
    conn = CephConnection(site())

    def not_found() -> None:
        raise rbd.ImageNotFound("x", errno=errno.ENOENT)

    with pytest.raises(CE.CephNotFound):
        conn._bounded("image info", "rbd/x", not_found, 5)

    def bug() -> None:
        raise TypeError("a bug, not a Ceph failure")

    with pytest.raises(TypeError):
        conn._bounded("image info", "rbd/x", bug, 5)
    assert conn._bounded("image info", "rbd/x", lambda: 42, 5) == 42


def test_a_call_before_connect_is_an_error_not_a_crash() -> None:
    with pytest.raises(CE.CephError, match="not connected"):
        CephConnection(site()).list_images("rbd")


# -- real librados, no cluster ------------------------------------------------------
def test_a_mon_address_with_nothing_listening_is_unreachable_within_the_deadline(
        keyring: str) -> None:
    s = site(connect_timeout_s=3, keyring=keyring)
    t0 = time.monotonic()
    with pytest.raises(CE.CephUnreachable) as ei, CephConnection(s):
        pass
    took = time.monotonic() - t0
    print(f"unreachable mon: {ei.value.code} errno {ei.value.errno} after {took:.2f} s "
          f"(connect_timeout_s 3)")
    # librados itself gave up (ETIMEDOUT), at client_mount_timeout, well
    # before the runner's bound (2 x 3 + 5 s).
    assert ei.value.errno == errno.ETIMEDOUT
    assert 2.5 <= took < 5, took


def test_a_missing_ceph_conf_is_not_found() -> None:
    with pytest.raises(CE.CephNotFound, match="read configuration /nonexistent/ceph.conf"):
        CephConnection(site(ceph_conf="/nonexistent/ceph.conf")).connect()


def test_the_site_check_names_connect_when_no_mon_answers(keyring: str) -> None:
    r = check_site(site(connect_timeout_s=1, keyring=keyring), replication_target=True)
    assert not r.ok
    assert r.failed is not None and r.failed.name == "connect"
    assert r.failed.code == "ceph_unreachable"
    assert [(s.name, s.status) for s in r.steps] == [
        ("connect", "fail"), ("pool_exists", "skip"), ("create_image", "skip"),
        ("create_snapshot", "skip"), ("snapshot_latency", "skip"), ("write", "skip"),
        ("diff", "skip"),
        ("remove_snapshot", "skip"), ("remove_image", "skip")]
    assert r.as_dict()["failed_check"] == "connect"
