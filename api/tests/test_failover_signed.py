"""failover_signed.signed_starts on a real database: a member VM that no DR
agent defines, with a captured definition (the XML recorded from libvirt,
data/domains/lab-rbd.xml), gets the DR host of `definition_targets` and a
vm.start spec whose XML names its replicated images by target dev in the
DR pool, the DR monitors, cephx user and secret, and whose signature
verifies with the public key for that VM's name only; a VM with no
captured definition, a site with no entry, or an unpinned target host get
none, with the reason."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cutpoint.api.config import DefinitionTarget
from cutpoint.api.models import Host, Site, Vm
from cutpoint.api.services import vm_definitions, vmdef_sign
from cutpoint.api.services.failover_signed import signed_starts
from cutpoint.api.services.vmdef_rewrite import rbd_images
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

XML = (Path(__file__).parent / "data" / "domains" / "lab-rbd.xml").read_text()
SECRET = "0b7e3c1a-2f45-4e8a-9d61-3c2a5e7f9b10"
DISKS = {"primary-h1-vm1": [("vda", "rbd", "primary-h1-vm1-disk0"),
                            ("vdb", "rbd", "primary-h1-vm1-disk1")],
         "primary-h1-vm2": [("vda", "rbd", "primary-h1-vm2-disk0")]}


def test_signed_starts(inventory: dict[str, Any], settings: Any, tmp_path: Path,
                       session_factory: sessionmaker[Session]) -> None:
    key = Ed25519PrivateKey.generate()
    (tmp_path / "sign.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    conf = settings.model_copy(update={
        "definition_signing_key": tmp_path / "sign.pem",
        "definition_targets": {"dr": DefinitionTarget(
            host="dr-h1", auth_user="cutpoint-dr", secret_uuid=SECRET,
            mon_hosts=["10.78.0.11:6789"],
            networks={"br-prod": "br-dr", "prod-backend": "dr-backend"})}})
    with session_factory() as s:
        dr = Site(name="dr", ceph_pools={"rbd": "dr-rbd"})
        s.add(dr)
        s.flush()
        host = Host(name="dr-h1", site_id=dr.id, address="10.78.1.1", port=7443)
        s.add(host)
        vm = s.scalars(select(Vm).where(Vm.name == "primary-h1-vm1")).one()
        vm_definitions.store(s, vm, {"format": "libvirt-domain-xml", "definition": XML})
        s.commit()
        # an unpinned target host is not used
        agents, specs, why = signed_starts(s, conf, "dr", "primary", DISKS)
        assert agents == {} and specs == {} and "not a pinned host" in why["primary-h1-vm1"]
        host.cert_fingerprint = hashlib.sha256(b"dr-h1").hexdigest()
        s.commit()
        agents, specs, why = signed_starts(s, conf, "dr", "primary", DISKS)
        assert agents == {"primary-h1-vm1": ("10.78.1.1", 7443, host.cert_fingerprint)}
        assert why == {"primary-h1-vm2": "no captured libvirt definition"}
        spec = specs["primary-h1-vm1"]
        assert spec["vm"] == "primary-h1-vm1"
        assert rbd_images(spec["xml"]) == ["dr-rbd/primary-h1-vm1-disk0",
                                           "dr-rbd/primary-h1-vm1-disk1"]
        assert f"uuid=\"{SECRET}\"" in spec["xml"] and "cutpoint-dr" in spec["xml"]
        assert "10.78.0.11" in spec["xml"] and "br-dr" in spec["xml"]
        sig = base64.b64decode(spec["sig"])
        key.public_key().verify(sig, vmdef_sign.message("primary-h1-vm1", spec["xml"]))
        # no entry for the site: nothing signed
        agents, specs, why = signed_starts(s, conf, "elsewhere", "primary", DISKS)
        assert agents == {} and specs == {} and set(why) == set(DISKS)
