"""Standard Webhooks signing (https://www.standardwebhooks.com): `webhook-id` (the delivery's
idempotency key), `webhook-timestamp` (seconds) and `webhook-signature: v1,<base64
HMAC-SHA256 of "id.timestamp.body">`, so a receiver verifies with the `standardwebhooks`
package. Each destination has its own secret (`whsec_<base64>`), sealed by the vault."""

from __future__ import annotations

import base64
import secrets
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook


def new_secret() -> str:
    """A fresh destination signing secret, as Standard Webhooks spells one."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def headers(secret: str, msg_id: str, body: str, now: datetime | None = None) -> dict[str, str]:
    """The signature headers of one attempt (the timestamp is the attempt's own)."""
    when = (now or datetime.now(UTC)).replace(microsecond=0)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, body),
        "content-type": "application/json",
    }


def sealed_name(destination: str) -> str:
    """The vault name a destination's secret is sealed under (its own namespace)."""
    return f"destination:{destination}"
