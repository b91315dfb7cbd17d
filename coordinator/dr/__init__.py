"""cutpoint.coordinator.dr: disaster-recovery orchestration on group snapshots.

It sits beside the two-phase commit of `cutpoint.coordinator` and uses it:
Ceph site access, replication to the DR site, drills, failover and failback.
It runs on an operator's own hosts and Ceph clusters; a test bed plugs its
own implementations into the protocols defined here and is never imported
from here.
"""
