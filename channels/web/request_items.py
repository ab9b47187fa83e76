"""A request a person answers (an approval, a budget's Continue, a credential, a connection) as the browser
gets it: what every kind has (its id, status, how it stands, when it expires and was asked), then the kind's
own fields (what is asked, and how to answer it)."""

from __future__ import annotations

from typing import Any

from core.model import ApprovalInfo, ConnectionRequestInfo, CredentialRequestInfo
from core.requests import PersonRequest
from core.self_approval import needs_other


def request_item(request: PersonRequest, asked_at: str, **own: Any) -> dict[str, Any]:
    return {"id": request.id, "status": request.status, "summary": request.summary(),
            "expires_at": request.expires_at.isoformat(), "at": asked_at, **own}


def approval_item(a: ApprovalInfo) -> dict[str, Any]:
    return request_item(a, a.parked_at.isoformat(), tool=a.tool, arguments=a.arguments, requester=a.requester,
                        quorum=a.quorum, progress=a.progress(), grantable=a.grantable, risk=a.risk,
                        thread_grantable=a.thread_grantable, grant_ttl_s=a.grant_ttl_s,
                        reminded=a.reminded, needs_other=needs_other(a), batch=a.batch,
                        edited_arguments=a.edited_arguments, edited_by=a.edited_by, editable=a.editable)


def credential_item(c: CredentialRequestInfo) -> dict[str, Any]:
    return request_item(c, c.created_at.isoformat(), name=c.name, reason=c.reason, scope=c.scope)


def connection_item(c: ConnectionRequestInfo) -> dict[str, Any]:
    return request_item(c, c.created_at.isoformat(), connection=c.connection, gap=c.gap, ask=c.ask(),
                        connect=f"/oauth/connect/{c.id}")
