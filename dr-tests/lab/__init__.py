"""cutpoint.lab: the lab test bed (two Ceph sites, host namespaces, QEMU guests)."""
