from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from cutpoint.api.schemas.common import Name, Public, Strict
from pydantic import Field, StringConstraints

WebhookUrl = Annotated[str, StringConstraints(pattern=r"^https?://[^\s/?#]+[^\s]*$",
                                              max_length=2048)]
SecretFile = Annotated[str, StringConstraints(pattern=r"^/[^\x00]*$", max_length=1024)]


class WebhookCreate(Strict):
    name: Name
    url: WebhookUrl
    events: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        min_length=1, max_length=16)
    secret_file: SecretFile = Field(description=(
        "Absolute path, on the control plane hosts, of the file that holds the HMAC "
        "secret; the secret itself is never sent to or stored by the API."))


class WebhookPublic(Public):
    id: int
    name: str
    url: str
    events: list[str]
    secret_file: str
    created_at: dt.datetime


class WebhookDeliveryPublic(Public):
    id: int
    webhook_id: int
    event: str
    payload: dict[str, Any]
    state: str
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    next_attempt_at: dt.datetime
    delivered_at: dt.datetime | None
