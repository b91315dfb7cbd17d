"""Webhook subscriptions (admin) and their deliveries (viewer)."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Admin, Cursor, Limit, SessionDep, Viewer
from cutpoint.api.models import Webhook, WebhookDelivery
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.webhooks import (
    WebhookCreate,
    WebhookDeliveryPublic,
    WebhookPublic,
)
from cutpoint.api.services import webhooks
from cutpoint.api.services.common import paginate
from fastapi import APIRouter, Path, Response
from sqlalchemy import select

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
WebhookRef = Annotated[str, Path(max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]


@router.get("", response_model=Page[WebhookPublic])
def list_webhooks(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[WebhookPublic]:
    """Every webhook subscription."""
    rows, nxt = paginate(session, select(Webhook), Webhook.id, limit, cursor)
    return Page(items=[WebhookPublic.model_validate(r) for r in rows], next_cursor=nxt)


@router.post("", status_code=201, response_model=WebhookPublic)
def create_webhook(data: WebhookCreate, session: SessionDep, _: Admin) -> WebhookPublic:
    """Subscribe `url` to `events` (see GET /v1/webhooks/events), signed with the
    secret in `secret_file`."""
    return WebhookPublic.model_validate(
        webhooks.create(session, data.name, data.url, list(data.events), data.secret_file))


@router.get("/events", response_model=list[str])
def list_events(_: Viewer) -> list[str]:
    """The event kinds a subscription can name."""
    return list(webhooks.EVENTS)


@router.delete("/{webhook}", status_code=204)
def delete_webhook(webhook: WebhookRef, session: SessionDep, _: Admin) -> Response:
    """Delete a subscription (by name or id) and its delivery record."""
    webhooks.delete(session, webhooks.resolve(session, webhook))
    return Response(status_code=204)


@router.get("/{webhook}/deliveries", response_model=Page[WebhookDeliveryPublic])
def list_deliveries(webhook: WebhookRef, session: SessionDep, _: Viewer, limit: Limit = 50,
                    cursor: Cursor = None) -> Page[WebhookDeliveryPublic]:
    """Newest first: each delivery's state, attempts, and the last answer."""
    w = webhooks.resolve(session, webhook)
    rows, nxt = paginate(session, select(WebhookDelivery).where(
        WebhookDelivery.webhook_id == w.id), WebhookDelivery.id, limit, cursor,
        newest_first=True)
    return Page(items=[WebhookDeliveryPublic.model_validate(r) for r in rows], next_cursor=nxt)
