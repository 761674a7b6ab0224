"""One long-lived Spark JVM per operator host process (start-up costs seconds here), and one fresh
SparkSession per task on top of it, so that nothing of a task survives into the next one.

`spark.master` comes from TRACE_SPARK_MASTER (default `local[*]`). A cluster is reached through
Spark Connect: TRACE_SPARK_MASTER=sc://host:port makes each task a Spark Connect session of
its own on that server (no JVM in the operator host at all; `remote_session`), whose executors
read and write the object store by key (`trace_platform.spark.objects`). A classic cluster
master (spark://, yarn, k8s://) needs the driver on the cluster's network, which the sandbox
does not give (`trace_platform.sandbox.resolve` says so). The JVM inherits the host's
stdout/stderr, which point at the worker's log file, so Spark's logs never reach the terminal.

The host's contract (one task at a time per host process):

    session = task_session()   # a newSession() of the base session: own SQL conf, temp views,
    try:                       # temporary functions and UDFs; the process' default session
        run_operator(session)  # while the task runs
    finally:
        end_task(session)      # drops what the task left in the shared JVM

- **A clean JVM.** PySpark starts the JVM with a copy of `os.environ`, and the JVM keeps that
  environment for its life (`java_method('java.lang.System','getenv',…)`, `${env:…}`, Python
  workers). `get_spark()` therefore narrows `os.environ` to `jvm_environment()` (PATH, JAVA_HOME,
  HOME, TMPDIR, LANG/LC_*, TZ, SPARK_*, PYSPARK_*, a few PYTHON* names, HADOOP_/YARN_ conf dirs,
  plus names listed in TRACE_SPARK_ENV_ALLOW) for the moment the JVM is launched, under this
  module's lock, and restores it at once. The host must never put slot secrets into its own
  environment; they reach operators through the task context. The JVM runs in a private
  working directory (`spark.sql.warehouse.dir` inside it), not in the host's cwd.
- **Hardened SQL.** Every session starts with `SESSION_HARDENING` (set in the SparkConf, so
  `newSession()` and `RESET` keep it): no SQL on files (``parquet.`/path` ``), no `${…}`
  variable substitution. `sql_transform` additionally checks each statement
  (`trace_platform.spark.sql_guard`).
- **Nothing survives a task.** `end_task` resets the catalog of the task's session and of the
  base one (`SessionCatalog.reset()`: temp views, temporary functions and UDFs, every global temp
  view - `global_temp` is shared by all sessions - and every database, table and function of
  the in-memory catalog), clears session variables, the shared cache (`clearCache`), persisted
  RDDs and the thread's local properties, resets the base session's `SET` state (`RESET`) and
  makes the base session the default again. The task session is then dropped with its own conf.
  If the task changed SparkContext-wide state that cannot be undone in place (added jars, files
  or archives), the JVM is stopped (`stop_spark()`) and the next task starts a new one.
  Costs: docs/benchmarks.md, "Isolation" (bench/sandbox_bench.py: a fresh host + JVM vs the
  next task of a tenant).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trace_platform.spark.conf import SESSION_HARDENING, user_conf
from trace_platform.spark.conf import check_user_conf as check_user_conf  # the package API

log = logging.getLogger("trace.spark")

_lock = threading.Lock()
_session: Any = None
_workdir: Path | None = None
_context_baseline: tuple[int, int, int] = (0, 0, 0)

JIT_OPTIONS = "-XX:-DontCompileHugeMethods"
# The JVM's compiler profile (TRACE_SPARK_JIT). "full": C2 too, which long stages over large
# data need. "quick": C1 only and the serial collector, for small data (the demo, the tests): a
# JVM start plus seven small window queries took 13-16 CPU-s instead of 31 on 2 cores, C2's
# compiles of Spark's generated code costing more than they ever win back on a few thousand rows.
JIT_PROFILES: dict[str, str] = {
    "full": JIT_OPTIONS,
    "quick": f"{JIT_OPTIONS} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def jit_options(environ: Mapping[str, str] | None = None) -> str:
    """The JVM options of TRACE_SPARK_JIT's profile (default "full")."""
    name = (os.environ if environ is None else environ).get("TRACE_SPARK_JIT") or "full"
    if name not in JIT_PROFILES:
        raise ValueError(f"TRACE_SPARK_JIT: {name!r} is not one of {sorted(JIT_PROFILES)}")
    return JIT_PROFILES[name]


# What the JVM's environment may hold: exact names, and name prefixes.
JVM_ENV_NAMES: frozenset[str] = frozenset(
    {
        "PATH",
        "JAVA_HOME",
        "HOME",
        "TMPDIR",
        "LANG",
        "LANGUAGE",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "USER",
        "LOGNAME",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONIOENCODING",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "VIRTUAL_ENV",
        "HADOOP_HOME",
        "HADOOP_CONF_DIR",
        "YARN_CONF_DIR",
    }
)
JVM_ENV_PREFIXES: tuple[str, ...] = ("SPARK_", "PYSPARK_")


def _extra_env_names(environ: Mapping[str, str]) -> set[str]:
    raw = environ.get("TRACE_SPARK_ENV_ALLOW", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def jvm_env_allowed(name: str, extra: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether the JVM may inherit the environment variable `name`."""
    return name in JVM_ENV_NAMES or name in extra or name.startswith(JVM_ENV_PREFIXES)


def jvm_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted part of `environ` (default: `os.environ`) the JVM is started with."""
    source = os.environ if environ is None else environ
    extra = _extra_env_names(source)
    return {k: v for k, v in source.items() if jvm_env_allowed(k, extra)}


class _NarrowedEnviron:
    """`os.environ` reduced to `jvm_environment()` inside the block, restored exactly after.
    Process-wide: only ever used under `_lock`, around the JVM launch."""

    def __enter__(self) -> None:
        self._saved = dict(os.environ)
        keep = jvm_environment(self._saved)
        keep.pop("SPARK_CONNECT_MODE_ENABLED", None)  # a local JVM, even in a Connect task
        for name in list(os.environ):
            if name not in keep:
                del os.environ[name]

    def __exit__(self, *exc: object) -> None:
        os.environ.clear()
        os.environ.update(self._saved)


def _conf_options(workdir: Path) -> dict[str, str]:
    master = os.environ.get("TRACE_SPARK_MASTER", "local[*]")
    return {
        # With a Spark Connect master the local JVM only parses (sql_plan_check.plan_parser).
        "spark.master": "local[1]" if is_remote(master) else master,
        "spark.app.name": "trace-operator-host",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": os.environ.get("TRACE_SPARK_SHUFFLE_PARTITIONS", "4"),
        "spark.driver.memory": os.environ.get("TRACE_SPARK_DRIVER_MEMORY", "2g"),
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": str(workdir / "warehouse"),
        # Spark generates one method per stage; with exact amounts (spark/u256.py: nine-limb
        # structs) it often passes 8,000 bytes of bytecode, which HotSpot never JIT-compiles by
        # default: such a stage then runs interpreted, 2-3x slower.
        "spark.driver.extraJavaOptions": jit_options(),
        "spark.executor.extraJavaOptions": jit_options(),
        **user_conf(),
        **SESSION_HARDENING,
    }


def _start() -> Any:
    """Launches the JVM with the allowlisted environment, in a private directory."""
    global _workdir, _context_baseline
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (the decode's mapInArrow) run this interpreter, whose environment has the
    # platform's packages, unless the host chose one (the sandbox sets it to the same).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    _workdir = Path(tempfile.mkdtemp(prefix="trace-spark-"))
    conf = SparkConf()
    for key, value in _conf_options(_workdir).items():
        conf.set(key, value)
    with _NarrowedEnviron():
        gateway = launch_gateway(conf, popen_kwargs={"cwd": str(_workdir)})
        context = SparkContext(conf=conf, gateway=gateway)
        session = SparkSession(context)
    context.setLogLevel("WARN")
    _context_baseline = _context_state(session)
    return session


def get_spark() -> Any:
    """The host's base SparkSession (starts the JVM on first use). Tasks should not use it
    directly: `task_session()` gives each task its own session on the same JVM."""
    global _session
    with _lock:
        if _session is None or _session.sparkContext._jsc is None:
            _session = _start()
        return _session


def _make_default(session: Any) -> None:
    """Makes `session` what `SparkSession.builder.getOrCreate()` / `SparkSession.active()`
    return, in Python and in the JVM, so operator code that asks for "the" session gets it."""
    from pyspark.sql import SparkSession

    SparkSession._instantiatedSession = session
    SparkSession._activeSession = session
    jclass = SparkSession._get_j_spark_session_class(session._jvm)
    jclass.setDefaultSession(session._jsparkSession)
    jclass.setActiveSession(session._jsparkSession)


def is_remote(master: str) -> bool:
    """Whether `master` is a Spark Connect endpoint (sc://host:port)."""
    return master.startswith("sc://")


def remote_session(url: str) -> Any:
    """A new Spark Connect session of its own on the server at `url` (its own SQL conf, temp
    views and functions server-side), hardened, with `trace_objects` registered."""
    # This marks the process "Connect mode" (SPARK_CONNECT_MODE_ENABLED, which makes
    # pyspark.sql.functions build Connect columns) until the host restores its environment at
    # the end of the task; `_start` hides it while a local JVM (the plan parser) launches.
    from pyspark.sql import SparkSession

    from trace_platform.spark.objects import TraceObjects

    session = SparkSession.builder.remote(url).create()
    session_level = {k: v for k, v in user_conf().items() if k.startswith("spark.sql.")}
    settings = {"spark.sql.session.timeZone": "UTC", **session_level, **SESSION_HARDENING}
    try:
        for key, value in settings.items():
            try:
                session.conf.set(key, value)
            except Exception as e:  # e.g. a static setting: the server's, not a session's
                raise ValueError(
                    f"the Spark Connect session refused {key}={value} (set it on the Connect "
                    f"server instead): {spark_error_text(e, 1)}"
                ) from None
        session.dataSource.register(TraceObjects)
    except BaseException:
        session.stop()
        raise
    return session


def task_session(remote: str | None = None) -> Any:
    """A fresh SparkSession for one task: with `remote` (sc://), a Spark Connect session of its
    own on that server; else `newSession()` of the long-lived base session (own SQL conf, temp
    views, temporary functions and UDFs; shared JVM, SparkContext and cache). Either way with
    `SESSION_HARDENING` applied; a local one is the process' default session until `end_task`."""
    if remote is not None:
        return remote_session(remote)
    base = get_spark()
    session = base.newSession()
    for key, value in SESSION_HARDENING.items():
        session.conf.set(key, value)
    _make_default(session)
    return session


def _context_state(session: Any) -> tuple[int, int, int]:
    """How many jars, files and archives the SparkContext holds: added ones survive any session,
    so a change means the JVM must go."""
    sc = session.sparkContext._jsc.sc()
    return (sc.listJars().size(), sc.listFiles().size(), sc.listArchives().size())


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _reset_catalog(session: Any) -> None:
    """Everything of the catalog a session reaches: its temp views, temporary functions and
    UDFs, session variables, and, shared by all sessions, global temp views and the in-memory
    catalog's databases, tables and functions. `SessionCatalog.reset()` does it in one JVM call
    (milliseconds); the public API is the fallback should that internal method ever go."""
    jsession = session._jsparkSession
    try:
        jsession.sessionState().catalog().reset()
    except Exception:  # the internal method is gone: the slow, public way
        log.warning("SessionCatalog.reset() failed; dropping catalog objects one by one")
        _drop_catalog_objects(session)
    with contextlib.suppress(Exception):  # session variables (DECLARE VARIABLE), Spark 4
        jsession.sessionState().catalogManager().tempVariableManager().clear()


def _drop_catalog_objects(session: Any) -> None:
    catalog = session.catalog
    for table in catalog.listTables():
        if table.isTemporary and not table.namespace:
            catalog.dropTempView(table.name)
    for row in session.sql("SHOW USER FUNCTIONS").collect():
        name = str(row[0])
        if "." in name:  # a persistent function in the in-memory catalog
            session.sql(f"DROP FUNCTION IF EXISTS {'.'.join(map(_quote, name.split('.')))}")
        else:
            session.sql(f"DROP TEMPORARY FUNCTION IF EXISTS {_quote(name)}")
    global_db = session.conf.get("spark.sql.globalTempDatabase", "global_temp")
    for table in catalog.listTables(global_db):
        if table.isTemporary:
            catalog.dropGlobalTempView(table.name)
    for db in catalog.listDatabases():
        if db.name not in ("default", global_db):
            session.sql(f"DROP DATABASE IF EXISTS {_quote(db.name)} CASCADE")
    for table in catalog.listTables("default"):
        if not table.isTemporary:
            kind = "VIEW" if table.tableType == "VIEW" else "TABLE"
            session.sql(f"DROP {kind} IF EXISTS `default`.{_quote(table.name)}")


def _drop_shared_state(base: Any) -> None:
    """What the SparkContext shares beyond the catalog: the cache, persisted RDDs, and the
    calling thread's local properties (job group, description, scheduler pool)."""
    base.catalog.clearCache()
    jsc = base.sparkContext._jsc
    rdds = jsc.getPersistentRDDs()
    for rdd_id in list(rdds.keySet().toArray()):
        rdds.get(rdd_id).unpersist(False)
    props = jsc.sc().getLocalProperties()
    for key in list(props.stringPropertyNames().toArray()):
        base.sparkContext.setLocalProperty(str(key), None)


def end_task(session: Any | None = None) -> None:
    """Drops everything a task left in the shared JVM (see the module doc): its session's temp
    views and functions, global temp views, catalog tables, the cache, persisted RDDs, and the
    base session's temp views, functions and SET state; makes the base session the default
    again; stops the JVM when the task changed state only a restart can undo. A no-op in a host
    that never started Spark. A Spark Connect session is released (only CLUSTER_OPERATORS get
    one, and they make nothing server-wide, so nothing shared is touched: the server may be
    serving other tasks, or use a metastore); the host's local JVM (its plan parser) is then
    cleaned as after any task."""
    global _session
    if session is not None and type(session).__module__.startswith("pyspark.sql.connect"):
        session.stop()  # its temp views, functions and conf go with it, server-side
        session = None
    with _lock:
        base = _session
    if base is None or base.sparkContext._jsc is None:
        return
    if session is not None and session is not base and session.sparkContext._jsc is not None:
        _reset_catalog(session)
    _reset_catalog(base)
    _drop_shared_state(base)
    base.sql("RESET")  # the base session's runtime conf back to the SparkConf (hardening kept)
    _make_default(base)
    if _context_state(base) != _context_baseline:
        log.warning("a task added jars/files to the SparkContext: stopping the Spark JVM")
        stop_spark()


def stop_spark() -> None:
    """Stops the SparkContext and the JVM process itself (the next `get_spark()` or
    `task_session()` starts a fresh one, ~4 s): for state no clean-up can undo, or to give a
    tenant a JVM of its own."""
    global _session, _workdir
    from pyspark import SparkContext

    with _lock:
        session, _session = _session, None
        if session is not None:
            try:
                session.stop()
            except Exception:  # stopping a broken context: the JVM goes anyway
                log.exception("stopping the SparkContext failed")
        gateway = SparkContext._gateway
        SparkContext._gateway = None
        SparkContext._jvm = None
        if gateway is not None:
            proc = getattr(gateway, "proc", None)
            with contextlib.suppress(Exception):  # already gone
                gateway.shutdown()
            if proc is not None:  # the gateway JVM exits when its stdin closes
                if proc.stdin is not None:
                    proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except Exception:  # do not leave it running
                    proc.kill()
        if _workdir is not None:
            shutil.rmtree(_workdir, ignore_errors=True)
            _workdir = None


def spark_error_text(exc: BaseException, lines: int = 3) -> str:
    """The first useful lines of a Spark/JVM error (not the whole Java stack)."""
    text = str(exc).strip().splitlines()
    useful = [
        ln
        for ln in text
        if ln.strip() and not ln.lstrip().startswith(("at ", "...", "JVM stacktrace"))
    ]
    return "\n".join(useful[:lines]) or type(exc).__name__
