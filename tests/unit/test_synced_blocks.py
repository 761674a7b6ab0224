"""What sql_transform tells a query about its inputs' synced blocks."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

import pytest

from trace_platform.contract import CommittedScope, DatasetRef, RangeSpec, TaskPayload
from trace_platform.operators.context import OperatorContext, PermanentError
from trace_platform.operators.sql_transform import sql_transform, synced_blocks


def _ctx(tmp_path: Path, ranges: list[tuple[int, int]], **config: object) -> OperatorContext:
    ref = DatasetRef(
        dataset_uuid=uuid4(), dataset_version=uuid4(), dataset_name="ev", location="in/"
    )
    committed = [
        CommittedScope(
            dataset_uuid=ref.dataset_uuid,
            dataset_version=ref.dataset_version,  # type: ignore[arg-type]
            scope=f"range:{s}-{e}",
            range=RangeSpec(start=s, end=e),
            location=f"in/{s}/",
        )
        for s, e in ranges
    ]
    task = TaskPayload.model_construct(
        task_id=uuid4(), attempt=1, inputs=[ref], outputs=[ref], committed=committed, config=config
    )
    return OperatorContext(task=task, workdir=tmp_path, _send=lambda _m: None)


def test_the_synced_blocks_stop_at_the_first_gap(tmp_path: Path) -> None:
    """Blocks past a gap are not synced through: an analytic clipped to them would report
    flat stake across blocks never decoded."""
    got = synced_blocks(_ctx(tmp_path, [(4000, 4500), (0, 1000), (1000, 2000)]), ["ev"])
    assert got == {"ev_first_block": 0, "ev_last_block": 1999}
    overlapping = synced_blocks(_ctx(tmp_path, [(0, 1500), (1000, 2000)]), ["ev"])
    assert overlapping == {"ev_first_block": 0, "ev_last_block": 1999}
    none = synced_blocks(_ctx(tmp_path, []), ["ev"])
    assert none == {"ev_first_block": None, "ev_last_block": None}


def test_config_args_cannot_say_what_the_data_holds(tmp_path: Path) -> None:
    ctx = _ctx(
        tmp_path,
        [(0, 100)],
        sql="SELECT * FROM ev WHERE block_number <= :ev_last_block",
        args={"ev_last_block": 450},
    )
    with pytest.raises(PermanentError, match="ev_last_block: set by sql_transform"):
        sql_transform(ctx)
