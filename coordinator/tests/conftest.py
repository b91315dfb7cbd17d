"""Fixtures for coordinator tests against in-process agent-protocol peers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient.testing import PKI_ROLES, AgentPeer, make_pki
from cutpoint.coordinator import AgentSpec, GroupSpec, TlsSpec, TxLog, VMSpec


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    return make_pki(tmp_path_factory.mktemp("pki"),
                    {"agent": ["127.0.0.1"], "coordinator": [], "stranger": []},
                    roles=PKI_ROLES)


@pytest.fixture
def txlog(tmp_path: Path) -> TxLog:
    log = TxLog(f"sqlite:///{tmp_path}/coordinator.db")
    yield log
    log.dispose()


PeerFactory = Callable[[str, dict[str, list[str]]], Awaitable[AgentPeer]]


@pytest.fixture
async def peers(pki: dict[str, dict[str, str]]) -> AsyncIterator[PeerFactory]:
    started: list[AgentPeer] = []

    async def make(host: str, vms: dict[str, list[str]]) -> AgentPeer:
        p = AgentPeer(host, vms, ca=pki["ca"]["cert"], cert=pki["agent"]["cert"],
                      key=pki["agent"]["key"])
        await p.start()
        started.append(p)
        return p

    yield make
    for p in started:
        await p.stop()


@pytest.fixture
def make_spec(pki: dict[str, dict[str, str]]) -> Callable[..., GroupSpec]:
    def make(agents: list[AgentPeer], **kw: object) -> GroupSpec:
        return spec_for(pki, agents, **kw)  # type: ignore[arg-type]
    return make


def spec_for(pki: dict[str, dict[str, str]], agents: list[AgentPeer], *,
             group: str = "g1", lease_ms: int = 2000, budget_ms: int = 1000,
             prepare_timeout_ms: int | None = None, **kw: Any) -> GroupSpec:
    return GroupSpec(
        name=group, lease_ms=lease_ms, budget_ms=budget_ms,
        prepare_timeout_ms=prepare_timeout_ms, **kw,
        tls=TlsSpec(ca=pki["ca"]["cert"], cert=pki["coordinator"]["cert"],
                    key=pki["coordinator"]["key"]),
        agents=tuple(AgentSpec(name=p.host, address=p.address, port=p.port,
                               vms=tuple(VMSpec(v.name, tuple(v.disks))
                                         for v in p.vms.values()))
                     for p in agents))


# -- the lab ------------------------------------------------------------------
# The `lab` fixture is owned by the lab (dr-tests/tests/conftest.py).  Load
# that file under its own module name and re-export its fixtures here, so the
# coordinator's lab tests run on exactly the same lab bring-up.
def _load_lab_fixtures() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "dr-tests" / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("cutpoint_lab_fixtures", path)
    if spec is None or spec.loader is None or not path.exists():
        return None
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception:  # noqa: BLE001 - the lab is optional for unit tests
        return None
    return mod


_lab = _load_lab_fixtures()
if _lab is not None:
    lab_session = _lab.lab_session
    lab = _lab.lab


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lab_config(**params): parameters of the lab the `lab` fixture brings up")
