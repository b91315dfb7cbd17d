from __future__ import annotations

from typing import Annotated, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

T = TypeVar("T")

# Names appear in snapshot names (cp.<group>.<txn>) and in URLs: keep them tame.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
Description = Annotated[str, StringConstraints(max_length=255)]


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` to get the next page; null on the last page.")
