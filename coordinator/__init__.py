"""cutpoint.coordinator: the two-phase group snapshot protocol.

Entry points shared by the CLI and the control plane:

    spec = GroupSpec(...)  or  load_group_file(path)
    txlog = TxLog("sqlite:///coordinator.db")       # or postgresql+psycopg://
    result = await take_group_snapshot(spec, txlog)
    await resolve_in_doubt(txlog, pool)             # at start

The transaction-log tables are `cutpoint.coordinator.txlog.METADATA`.
"""

from cutpoint.coordinator.groupfile import GroupFileError, load_group_file
from cutpoint.coordinator.results import GroupSnapshotResult, VMTiming
from cutpoint.coordinator.spec import AgentSpec, GroupSpec, SpecError, TlsSpec, VMSpec
from cutpoint.coordinator.twophase import (
    CoordinatorError,
    GroupBusy,
    TxnInFlight,
    new_txn_id,
    pool_for,
    resolve_in_doubt,
    take_group_snapshot,
)
from cutpoint.coordinator.txlog import METADATA, TxLog, TxLogError

__all__ = [
    "METADATA", "AgentSpec", "CoordinatorError", "GroupBusy", "GroupFileError",
    "GroupSnapshotResult", "GroupSpec", "SpecError", "TlsSpec", "TxLog", "TxLogError",
    "TxnInFlight", "VMSpec", "VMTiming", "load_group_file", "new_txn_id", "pool_for",
    "resolve_in_doubt", "take_group_snapshot",
]
