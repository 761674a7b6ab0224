"""Request bodies of the user-facing API (the internal ones are the wire contract,
`trace_platform.contract`). Each refuses fields it does not know."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from trace_platform.control.identity import MAX_KEY_LIFETIME
from trace_platform.delivery.safety import MAX_URL
from trace_platform.query import saved


class DeployBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    yaml: str = Field(max_length=1024 * 1024)
    source: str | None = None


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: int | None = Field(default=None, ge=1, description="default: the previous live version")


class TriggerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any] = Field(default_factory=dict)


class BackfillBody(BaseModel):
    """Which scopes to replay for which jobs: blocks [from_block, to_block] or named scopes,
    or (neither) every scope the inputs hold; no jobs: every job that runs on its inputs."""

    model_config = ConfigDict(extra="forbid")
    jobs: list[str] = Field(default_factory=list, max_length=1000)
    from_block: int | None = Field(default=None, ge=0)
    to_block: int | None = Field(default=None, ge=0)
    scopes: list[str] = Field(default_factory=list, max_length=1000)
    dry_run: bool = False


class RolesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    add: list[str] = Field(default_factory=list)
    remove: list[str] = Field(default_factory=list)


class PurgeBody(BaseModel):
    """`keep`: how many of the newest complete versions to keep besides those still needed."""

    model_config = ConfigDict(extra="forbid")
    keep: int = Field(ge=0)
    dry_run: bool = False


class QueryBody(BaseModel):
    """Exactly one of `sql` or `saved` (a saved query's name, with `params`)."""

    model_config = ConfigDict(extra="forbid")
    sql: str | None = Field(default=None, max_length=100_000)
    saved: str | None = None
    params: dict[str, str | int] = Field(default_factory=dict)
    format: Literal["json", "csv", "parquet"] = "json"
    export: bool = False
    max_rows: int | None = Field(default=None, gt=0)
    timeout_seconds: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_statement(self) -> QueryBody:
        if (self.sql is None) == (self.saved is None):
            raise ValueError("give exactly one of sql or saved")
        return self

    def producer(self) -> str | None:
        """The DAG a saved query must read from (None: plain SQL reads what the name holds)."""
        return saved.load(self.saved).producer if self.saved is not None else None

    def statement(self) -> tuple[str, dict[str, Any]]:
        if self.saved is not None:
            q = saved.load(self.saved)
            return q.sql, q.params(self.params)
        assert self.sql is not None
        return self.sql, dict(self.params)


class SecretBody(BaseModel):
    """`use_roles` replaces the secret's use_roles; omitted, they are kept (none when new)."""

    model_config = ConfigDict(extra="forbid")
    value: SecretStr
    use_roles: list[str] | None = None


class NameGrantBody(BaseModel):
    """A name or a prefix (`team_a_*`) and exactly one grantee: a user or a role."""

    model_config = ConfigDict(extra="forbid")
    pattern: str = Field(max_length=129)
    user: str | None = Field(default=None, max_length=128)
    role: str | None = Field(default=None, max_length=128)


class DestinationBody(BaseModel):
    """A webhook destination. `allow_private`: a loopback, private or link-local address (or
    a platform port) is allowed for it (refused otherwise, checked again at every send)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=128)
    url: str = Field(max_length=MAX_URL)  # the bound the Delivery Service holds it to
    allow_private: bool = False


class UserBody(BaseModel):
    """A user to add (or an existing or removed one's roles and admin flag to set); answered
    with a new API key for them, shown once."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=128)
    roles: list[str] = Field(default_factory=list, max_length=100)
    is_admin: bool = False


class KeyBody(BaseModel):
    """A new API key for `user`, answered once; an optional expiry as `expires_in_seconds` or
    `expires_at` (with a time zone), not both."""

    model_config = ConfigDict(extra="forbid")
    user: str = Field(max_length=128)
    name: str | None = Field(default=None, max_length=100)
    expires_in_seconds: float | None = Field(
        default=None, gt=0, le=MAX_KEY_LIFETIME.total_seconds()
    )
    expires_at: datetime | None = None


class RotateBody(BaseModel):
    """A key's successor, answered once; the old key revoked after `grace_seconds`. The new
    key's expiry as in KeyBody, else the old key's lifetime if it had one."""

    model_config = ConfigDict(extra="forbid")
    grace_seconds: float = Field(default=0, ge=0, le=3600)
    expires_in_seconds: float | None = Field(
        default=None, gt=0, le=MAX_KEY_LIFETIME.total_seconds()
    )
    expires_at: datetime | None = None
