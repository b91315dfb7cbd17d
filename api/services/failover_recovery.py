"""What a failed failover left behind, and what the operator runs next.

A failover moves through stages; how far it got decides what is safe now:

    checking   preconditions, and in planned mode the final group snapshot
               (a normal, bounded pause): production was not touched, every
               primary VM runs, nothing was fenced
    stopped    the primary VMs were asked to stop (and the group's schedule
               disabled), no fencing epoch was taken, DR was not written:
               retry from a DR recovery point, or roll back to the primary
    fenced     the fencing epoch is taken and the DR images carry it: DR is
               the only writer; retry (it reuses the epoch); going back to
               the primary is a failback
"""

from __future__ import annotations

from collections.abc import Sequence

CHECKING, STOPPED, FENCED = "checking", "stopped", "fenced"


def production_touched(stage: str) -> bool:
    return stage != CHECKING


def next_step(stage: str, group: str, *, retry_txn: str | None = None,
              vms: Sequence[str] = (), epoch: int | None = None,
              unreplicated_id: int | None = None) -> str:
    """One sentence an operator can act on, with the commands to run."""
    retry = (f"`cutpoint dr failover {group} --mode unplanned --recovery-point {retry_txn} --yes`"
             if retry_txn else f"`cutpoint dr failover {group} --mode unplanned --yes`")
    if stage == CHECKING:
        return ("Nothing was stopped or fenced: every primary VM still runs and the group "
                "is unchanged. Fix what failed and ask for the failover again.")
    if stage == STOPPED:
        first = (f"replicate the stopped-disk snapshot (`cutpoint dr replicate "
                 f"{unreplicated_id}`) and fail over from it, or " if unreplicated_id else "")
        return (f"The primary VMs ({', '.join(vms) or 'none'}) were stopped; no fencing epoch "
                "was taken and nothing at DR was changed. Either retry: "
                f"{first}{retry} (DR recovery point {retry_txn or 'the newest'}; writes after "
                "its cut are on the primary disks only); or roll back to the primary: start "
                "those VMs again on their hosts and re-enable the schedule with "
                f"`cutpoint group enable {group}`.")
    return (f"The primary is fenced (epoch {epoch}: DR is the only writer, replication from "
            f"the primary is refused) and its VMs were stopped. Retry: {retry} (it reuses "
            f"epoch {epoch}). Going back to the primary from here is a failback, not a "
            "restart: the DR images may have been written.")
