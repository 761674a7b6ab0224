"""Operator configs: each operator declares a pydantic model of its `config`, checked twice with
the same definition: by `trace dag validate` / deploy (every problem at once, at
`jobs.<job>.config.<field>`) and by the operator when it runs (a PermanentError naming them).

A model may also check the config against the job's shape (how many inputs and outputs) with
`job_problems`; deploy reports those like the field problems."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from trace_platform.operators.context import OperatorContext, PermanentError


class OperatorConfig(BaseModel):
    """A config model: unknown keys are refused unless a model says otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        """(field, message) problems of this config for a job with this many inputs/outputs."""
        return []

    @classmethod
    def from_ctx(cls, ctx: OperatorContext, data: dict[str, Any] | None = None) -> Self:
        """The task's config (or `data`) through this model; a PermanentError naming every
        problem otherwise (no retry can fix a config)."""
        try:
            return cls.model_validate(ctx.config if data is None else data)
        except ValidationError as e:
            text = "; ".join(f"{where}: {msg}" if where else msg for where, msg in problems(e))
            name = getattr(ctx.task, "operator", None) or "operator"
            raise PermanentError(f"{name} config: {text}") from None


def where(loc: tuple[Any, ...]) -> str:
    """A pydantic location as the DAG file spells it: `datatypes[0]`, `args.window`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def message(err: ErrorDetails) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "missing":
        return "required field is missing"
    return msg


def problems(err: ValidationError) -> list[tuple[str, str]]:
    return [(where(tuple(e["loc"])), message(e)) for e in err.errors()]
