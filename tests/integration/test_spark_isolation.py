"""Spark without leaks between tasks, and sql_transform's guard in front of a real Spark.

One JVM for the module (as in an operator host); every test ends its tasks with `end_task`."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import sqlglot
import yaml

import trace_platform.spark as tspark
from tests.support.amounts import SPARK_LIMBS, limbs
from trace_platform.contract import CommittedScope, DatasetRef, TaskPayload
from trace_platform.objectstore.local import LocalStore
from trace_platform.operators.context import OperatorContext, PermanentError
from trace_platform.operators.sql_transform import sql_transform
from trace_platform.spark import helpers
from trace_platform.spark.dialect import DIALECT
from trace_platform.spark.sql_guard import CheckedQuery, SqlRefused, check_query
from trace_platform.spark.sql_plan_check import check_spark_plan

pytest.importorskip("pyspark")

MARKER = "TRACE_TEST_JVM_MARKER"
DEMO = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"
ZERO = "0x" + "0" * 40


@pytest.fixture(scope="module")
def base() -> Iterator[Any]:
    """The host's base session, started while the host's environment holds a "secret"."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    started_here = tspark._session is None
    os.environ[MARKER] = "first-task-secret"
    try:
        session = tspark.get_spark()
    finally:
        del os.environ[MARKER]
    session.started_here = started_here  # type: ignore[attr-defined]
    yield session
    tspark.stop_spark()


def _fails(session: Any, sql: str) -> bool:
    try:
        session.sql(sql).collect()
    except Exception as e:  # AnalysisException and friends
        return type(e).__name__ in ("AnalysisException", "ParseException")
    return False


def test_the_jvm_environment_is_allowlisted(base: Any) -> None:
    env = base.sparkContext._jvm.java.lang.System.getenv()
    names = [str(n) for n in env.keySet().toArray()]
    allowed_by_launcher = {"PWD", "SHLVL", "_PYSPARK_DRIVER_CONN_INFO_PATH"}  # spark-submit's own
    assert [
        n for n in names if not tspark.jvm_env_allowed(n) and n not in allowed_by_launcher
    ] == []
    if base.started_here:
        assert MARKER not in names
        # Even SQL that slipped past every guard finds nothing to read.
        row = base.sql(f"SELECT java_method('java.lang.System', 'getenv', '{MARKER}') AS v").first()
        assert row is not None and row.v in (None, "null")  # String.valueOf(null)
    cwd = str(base.sparkContext._jvm.java.lang.System.getProperty("user.dir"))
    assert cwd != os.getcwd() and Path(cwd).name.startswith("trace-spark-")


def test_jvm_environment_keeps_only_the_allowlist() -> None:
    env = {
        "PATH": "/usr/bin",
        "JAVA_HOME": "/jdk",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": "python3",
        "LANG": "C.UTF-8",
        "TRACE_STATE_DSN": "postgresql://superuser:pw@host/db",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "RPC_URL": "http://node",
        "KUBECONFIG": "/k",
        "TRACE_SPARK_ENV_ALLOW": "KUBECONFIG",
    }
    assert set(tspark.jvm_environment(env)) == {
        "PATH",
        "JAVA_HOME",
        "SPARK_LOCAL_IP",
        "PYSPARK_PYTHON",
        "LANG",
        "KUBECONFIG",
    }


def test_nothing_of_a_task_survives_into_the_next(base: Any, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    a = tspark.task_session()
    assert a is not base
    assert SparkSession.builder.getOrCreate() is a  # operator code asking for "the" session
    a.range(3).createOrReplaceTempView("left_behind")
    a.range(3).createOrReplaceGlobalTempView("left_behind_global")
    a.sql("SET spark.trace.left_behind=alice")
    a.sql("SET spark.sql.shuffle.partitions=13")
    a.range(5).createOrReplaceTempView("left_behind_cached")
    a.sql("CACHE TABLE left_behind_cached")
    frame = a.range(7)
    frame.cache().count()
    a.sparkContext.parallelize([1, 2]).cache().count()
    a.udf.register("left_behind_fn", lambda: "alice", "string")
    assert a.sql("SELECT left_behind_fn() AS v").first().v == "alice"
    a.sql("CREATE TEMPORARY FUNCTION left_behind_sql() RETURNS STRING RETURN 'alice'")
    a.sql("DECLARE VARIABLE left_behind_var STRING DEFAULT 'alice'")
    a.range(2).write.saveAsTable("left_behind_table")
    a.sql("CREATE DATABASE left_behind_db")
    assert a.catalog.isCached("left_behind_cached")
    # The task also touched the base session, as a host that hands out get_spark() would.
    base.range(1).createOrReplaceTempView("left_behind_on_base")
    base.sql("SET spark.trace.left_behind_base=alice")

    tspark.end_task(a)

    b = tspark.task_session()
    try:
        assert SparkSession.builder.getOrCreate() is b
        assert b.catalog.listTables() == []
        assert b.catalog.listTables("global_temp") == []
        assert [d.name for d in b.catalog.listDatabases()] == ["default"]
        assert b.conf.get("spark.trace.left_behind", None) is None
        assert b.conf.get("spark.sql.shuffle.partitions") != "13"
        assert b.conf.get("spark.sql.runSQLOnFiles") == "false"
        for sql in (
            "SELECT * FROM left_behind",
            "SELECT * FROM global_temp.left_behind_global",
            "SELECT * FROM left_behind_cached",
            "SELECT * FROM left_behind_table",
            "SELECT * FROM left_behind_on_base",
            "SELECT left_behind_fn()",
            "SELECT left_behind_sql()",
            "SELECT left_behind_var",
            "USE left_behind_db",
        ):
            assert _fails(b, sql), sql
        assert b.sql("SHOW USER FUNCTIONS").collect() == []
        assert b._jsparkSession.sharedState().cacheManager().isEmpty()
        assert b.sparkContext._jsc.getPersistentRDDs().size() == 0
        assert base.catalog.listTables() == []
        assert base.conf.get("spark.trace.left_behind_base", None) is None
    finally:
        tspark.end_task(b)
    assert SparkSession.builder.getOrCreate() is base


def test_end_task_without_a_task_session_cleans_the_base_session(base: Any) -> None:
    base.range(1).createOrReplaceTempView("left_behind")
    base.range(1).createOrReplaceGlobalTempView("left_behind")
    base.sql("SET spark.trace.left_behind=alice")
    tspark.end_task(None)
    assert base.catalog.listTables() == []
    assert base.catalog.listTables("global_temp") == []
    assert base.conf.get("spark.trace.left_behind", None) is None


def test_sessions_are_hardened(base: Any) -> None:
    s = tspark.task_session()
    try:
        # No ${env:…} substitution, no SQL on files, even for SQL that skipped the guard.
        assert s.sql("SELECT '${env:PATH}' AS v").first().v == "${env:PATH}"
        assert _fails(s, "SELECT * FROM text.`/etc/hostname`")
    finally:
        tspark.end_task(s)


def test_sql_transform_refuses_java_method_before_touching_anything(tmp_path: Path) -> None:
    ctx = _context(  # no store, no Spark: using either would fail differently
        tmp_path,
        "SELECT java_method('java.lang.System', 'getenv', 'TRACE_STATE_DSN') AS v FROM t",
        [("t", "in/t/")],
    )
    with pytest.raises(PermanentError, match="function 'java_method' is not allowed"):
        sql_transform(ctx)
    assert ctx._spark is None
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("SELECT TRANSFORM(id) USING 'cat' AS (a) FROM t", "TRANSFORM … USING"),
        ("SELECT reflect('java.lang.System', 'getenv', 'X')", "function 'reflect' is not allowed"),
        ("SELECT * FROM other", "table [other] is not an input"),
        ("SELECT * FROM text.`/etc/hostname`", "table [text, /etc/hostname] is not an input"),
        ("SELECT db.f(1)", "qualified function name"),
        ("SELECT no_such_fn(1)", "not a Spark built-in"),
    ],
)
def test_sparks_own_parser_is_a_second_wall(base: Any, sql: str, needle: str) -> None:
    # These never get past check_query; here they reach Spark's parser directly.
    unchecked = CheckedQuery(
        sql=sql, tables=frozenset({"t"}), ctes=frozenset(), parameters=frozenset()
    )
    with pytest.raises(SqlRefused, match=needle.replace("[", r"\[").replace("]", r"\]")):
        check_spark_plan(base, unchecked)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'it''s' AS a, \"d\"\"q\" AS b, 'x\\'y' AS c, 'p' 'q' AS d, r'\\n' AS e",
        "SELECT 12345678901234567890BD AS a, 10L AS b, DATE '2024-01-01' AS c, INTERVAL 1 DAY AS d",
        "SELECT 7 DIV 2 AS a, 2 ^ 3 AS b, 'x' || 'y' AS c, X'0A' AS d, 1.5e3 AS e",
        "SELECT CAST(12345678901234567890123456789012345678 AS DECIMAL(38,0)) AS a",
    ],
)
def test_regenerated_sql_means_what_the_user_wrote(base: Any, sql: str) -> None:
    s = tspark.task_session()
    try:
        assert _rows(s.sql(check_query(sql, []).sql)) == _rows(s.sql(sql))
    finally:
        tspark.end_task(s)


# --- the demo's analytics: same results through the guard ------------------------------------


def _demo_sql() -> dict[str, tuple[str, dict[str, Any]]]:
    dag = yaml.safe_load(DEMO.read_text())
    return {
        name: (job["config"]["sql"], job["config"].get("args") or {})
        for name, job in dag["jobs"].items()
        if job["operator"] == "sql_transform"
    }


def _transfers(spark: Any) -> Any:
    rnd = random.Random(7)
    tokens = ["0x" + "a" * 40, "0x" + "b" * 40]
    people = ["0x" + c * 40 for c in "123456"]
    rows = []
    for _ in range(120):
        kind = rnd.random()
        src = ZERO if kind < 0.25 else rnd.choice(people)
        dst = ZERO if 0.25 <= kind < 0.35 else rnd.choice(people)
        rows.append(
            (rnd.randrange(0, 400), rnd.choice(tokens), src, dst, _limbs(rnd.randrange(2**256)))
        )
    schema = (
        "block_number BIGINT, token_address STRING, from_address STRING, to_address STRING, "
        f"value {SPARK_LIMBS}"
    )
    return spark.createDataFrame(rows, schema)  # as decode stores it


def _staking(spark: Any) -> Any:
    """Delegations and undelegations of a few delegators, and an epoch change every 100 blocks."""
    rnd = random.Random(11)
    rows = []
    for _ in range(80):
        validator = rnd.choice([1, 2, 3, 4])
        amount = rnd.randrange(-500, 2000) * 10**60
        event = "Delegate" if amount >= 0 else "Undelegate"
        who = "0x" + rnd.choice("abc") * 40
        rows.append((rnd.randrange(0, 450), event, validator, who, _limbs(amount), None))
    rows += [(b, "EpochChanged", None, None, _limbs(0), b // 100) for b in (100, 200, 300, 400)]
    schema = (
        "block_number BIGINT, event STRING, validator_id BIGINT, delegator STRING, "
        f"amount_delta {SPARK_LIMBS}, epoch BIGINT"
    )
    return spark.createDataFrame(rows, schema)


def _limbs(v: int) -> tuple[int, ...]:
    return tuple(limbs(v).values())


def _rows(frame: Any) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
    return frame.dtypes, [tuple(r) for r in frame.collect()]


def test_the_demo_analytics_give_identical_results_through_the_guard(base: Any) -> None:
    jobs = _demo_sql()
    s = tspark.task_session()
    try:
        _transfers(s).createOrReplaceTempView("erc20_transfers")
        _staking(s).createOrReplaceTempView("staking_events")
        views = {
            "token_supply": ["erc20_transfers", "input_1"],
            "token_balances": ["erc20_transfers", "input_1"],
            "staking_periods": ["staking_events", "input_1"],
            "validator_stake": ["staking_events", "staking_periods"],
            "staking_concentration": ["validator_stake"],
            "delegator_stake": ["staking_events", "staking_periods"],
            "delegator_concentration": ["delegator_stake"],
        }
        synced = {"staking_events_first_block": 0, "staking_events_last_block": 449}
        assert set(views) == set(jobs)  # every analytic of the demo
        for job, reads in views.items():
            sql, args = jobs[job]
            checked = check_query(sql, reads)
            check_spark_plan(s, checked)
            bound = {k: v for k, v in {**synced, **args}.items() if k in checked.parameters}
            # The u256 helpers expanded, nothing else done to the text: what the user meant.
            expanded = helpers.expand(sqlglot.parse_one(sql, read=DIALECT)).sql(dialect=DIALECT)
            # Computed once, kept for the analytics after it (they would recompute the chain
            # of views under them for every query otherwise).
            original = s.sql(expanded, args=bound or None).localCheckpoint()
            dtypes, rows = _rows(original)
            assert rows, job
            if checked.sql != expanded:
                # Only the text's meaning is kept by the guard, not the text itself: compare
                # what Spark makes of each. (The same text, as now, means the same results.)
                assert _rows(s.sql(checked.sql, args=bound or None)) == (dtypes, rows), job
            original.createOrReplaceTempView(job)  # read by the analytics after it
    finally:
        tspark.end_task(s)


def _context(
    tmp_path: Path,
    sql: str,
    inputs: list[tuple[str | None, str]],
    store: LocalStore | None = None,
    **config: Any,
) -> OperatorContext:
    refs = [
        DatasetRef(dataset_uuid=uuid4(), dataset_version=uuid4(), dataset_name=name, location=loc)
        for name, loc in inputs
    ]
    task = TaskPayload.model_construct(
        task_id=uuid4(),
        attempt=1,
        config={"sql": sql, **config},
        inputs=refs,
        outputs=[DatasetRef(dataset_uuid=uuid4(), dataset_version=uuid4(), location="out/v1/")],
        # Each input committed whole at its location (sql_transform reads only what is committed).
        committed=[
            CommittedScope(
                dataset_uuid=r.dataset_uuid,
                dataset_version=r.dataset_version,
                scope="all",
                location=r.location,
            )
            for r in refs
            if r.dataset_version is not None and r.location is not None
        ],
    )
    (tmp_path / "work").mkdir(exist_ok=True)
    return OperatorContext(
        task=task, workdir=tmp_path / "work", _send=lambda _m: None, _store=store
    )


def test_sql_transform_runs_the_checked_query_with_its_parameters(
    base: Any, tmp_path: Path
) -> None:
    sql, args = _demo_sql()["staking_periods"]
    store = LocalStore(tmp_path / "store")
    stage = tmp_path / "stage"
    _staking(base).coalesce(1).write.parquet(str(stage))
    for i, f in enumerate(sorted(stage.glob("*.parquet"))):
        store.put_file(f"in/staking/part-{i}.parquet", f)
    ctx = _context(
        tmp_path,
        sql,
        [("staking_events", "in/staking/"), (None, "in/complete/")],
        store,
        args=args,
    )
    try:
        result = sql_transform(ctx)
        assert ctx._spark is not None and ctx._spark is not base  # a task session of its own
        assert result.outputs[0].row_count and result.outputs[0].row_count > 0
        out = tmp_path / "out"
        out.mkdir()
        (written,) = (tmp_path / "store" / "out" / "v1").glob("t=*")  # the attempt's own keys
        for f in written.glob("*.parquet"):
            shutil.copy(f, out / f.name)
        got = base.read.parquet(str(out)).orderBy("first_block")
        _staking(base).createOrReplaceTempView("staking_events")
        # Inputs committed whole (no ranges): the synced blocks are NULL, the data's bounds used.
        unknown = {"staking_events_first_block": None, "staking_events_last_block": None}
        want = base.sql(check_query(sql, ["staking_events"]).sql, args={**args, **unknown})
        assert _rows(got) == _rows(want)
    finally:
        ctx.close()
        tspark.end_task(None)


def test_a_task_that_adds_files_gets_the_jvm_restarted(base: Any, tmp_path: Path) -> None:
    s = tspark.task_session()
    extra = tmp_path / "extra.txt"
    extra.write_text("x")
    s.sparkContext.addFile(str(extra))
    tspark.end_task(s)
    assert tspark._session is None  # stopped: added files cannot be removed from a context
    fresh = tspark.task_session()
    try:
        assert fresh.sparkContext._jsc.sc().listFiles().size() == 0
        assert fresh.range(3).count() == 3
    finally:
        tspark.end_task(fresh)


def test_user_spark_conf_is_honoured_but_never_undoes_the_hardening(tmp_path: Path) -> None:
    env = {"TRACE_SPARK_CONF": '{"spark.sql.shuffle.partitions": "7", "spark.executor.cores": "2"}'}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        opts = tspark._conf_options(tmp_path)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert opts["spark.sql.shuffle.partitions"] == "7" and opts["spark.executor.cores"] == "2"
    assert all(opts[k] == v for k, v in tspark.SESSION_HARDENING.items())
    for bad, why in (
        ({"spark.sql.runSQLOnFiles": "true"}, "hardened"),
        ({"spark.master": "local[1]"}, "TRACE_SPARK_MASTER"),
        ({"java.opts": "x"}, "not a Spark setting"),
    ):
        with pytest.raises(ValueError, match=why):
            tspark.check_user_conf(bad)
