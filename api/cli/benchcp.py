"""`cutpoint bench control-plane`: a light wrapper, so that importing the CLI
does not import FastAPI and SQLAlchemy (see cutpoint.api.benchmark)."""

from __future__ import annotations

from pathlib import Path


def control_plane(
    out: Path = Path("out/bench-control-plane.json"),
    steps: str = "25,100,400",
    rpo: int = 60,
    duration: float | None = None,
) -> None:
    """Control-plane benchmark: API p50/p99 and scheduler capacity at an RPO."""
    from cutpoint.api.benchmark import control_plane as run

    run(out=out, steps=steps, rpo=rpo, duration=duration)
