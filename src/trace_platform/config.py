"""Resolved configuration: `TRACE_*` environment variables over defaults (pydantic-settings)."""

from __future__ import annotations

import json
import re
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trace_platform.spark.conf import check_user_conf


class Profile(StrEnum):
    lite = "lite"
    aws = "aws"


class QueueBackend(StrEnum):
    pgqueue = "pgqueue"
    sqs = "sqs"


class ObjectStoreBackend(StrEnum):
    local = "local"
    s3 = "s3"


# A host name or IPv4 address as a worker advertises it (TRACE_WORKER_HOST): the first part of
# its id, host:pid:nonce, so no colon.
HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"


def url_host(bind: str) -> str:
    """The host part of a URL to this machine's listener bound to `bind`: a wildcard bind
    (every interface) is where it listens, not an address to connect to, so it is reached on
    loopback (where workers may use plain http); an IPv6 address goes in brackets."""
    if bind in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind == "::":
        return "[::1]"
    return f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRACE_", env_file=None, extra="ignore")

    profile: Profile = Profile.lite
    home: Path = Field(default=Path(".trace"), description="Lite working directory")

    # Postgres. With no DSN in the lite profile, an embedded cluster under `pg_data_dir` is used.
    state_dsn: SecretStr | None = None
    data_dsn: SecretStr | None = None
    read_dsn: SecretStr | None = None
    pg_data_dir: Path | None = None
    pg_bindir: Path | None = None
    pg_os_user: str | None = None
    pool_max_size: int = 10
    # A streaming replica of the state database (docs/operations.md, "A read replica"): the
    # read-only paths (run trees, task status and lists, DAG and dataset lists and shows, the
    # audit log) read it while it is at most read_replica_max_lag_seconds behind the primary,
    # else the primary. Not TRACE_READ_DSN: that is the Query Service's published-data login.
    read_replica_dsn: SecretStr | None = None
    read_replica_max_lag_seconds: float = Field(default=5.0, ge=0)

    queue_driver: QueueBackend | None = None
    task_queue: str = "tasks"
    # Tasks of runtime `lambda` are woken on this queue, which only the Lambda invoker takes
    # (`trace lambda-invoker`, docs/lambda.md): no platform worker ever claims one.
    lambda_queue: str = "lambda"
    queue_max_attempts: int = 20
    queue_poll_seconds: float = 1.0
    # The sqs driver (queue/sqs.py). A queue is the SQS queue `sqs_queue_prefix` + its name
    # (characters SQS refuses escaped: "buffer.ab" -> "trace-buffer-2eab"), with a dead-letter
    # queue of that name + "-dlq" named by its RedrivePolicy (maxReceiveCount =
    # queue_max_attempts); or a queue named in sqs_queue_urls ('{"tasks": "https://..."}'),
    # whose own RedrivePolicy names its DLQ. Queues are created on first use when
    # sqs_create_queues is on (the default: a buffered dataset's queue is made at its first
    # use, so the aws profile needs sqs:CreateQueue on the prefix's queues, docs/aws.md), else
    # looked up and refused if missing.
    sqs_region: str = "us-east-1"
    sqs_endpoint_url: str | None = None  # moto, LocalStack, a VPC endpoint
    sqs_queue_prefix: str = Field(default="trace-", pattern=r"^[A-Za-z0-9_-]{0,40}$")
    sqs_queue_urls: dict[str, str] = Field(default_factory=dict)
    sqs_create_queues: bool = True
    sqs_access_key_id: str | None = None  # else boto3's chain (instance role, AWS_* env)
    sqs_secret_access_key: SecretStr | None = None

    # The lambda runtime (docs/lambda.md). The invoker claims each lambda task as a worker does
    # and invokes the handler (trace_platform.aws.lambda_handler) with its payload: `local`
    # (Lite) runs it in a sandboxed subprocess killed after lambda_timeout_seconds; `aws` calls
    # Lambda's Invoke on lambda_function (RequestResponse, no SDK retries: retries are the
    # Dispatcher's), its read timeout above lambda_timeout_seconds, which must be at least the
    # function's own timeout. lambda_concurrency: invocations in flight per invoker.
    lambda_invoker: Literal["local", "aws"] = "local"
    lambda_function: str = "trace-operator"
    lambda_timeout_seconds: float = Field(default=900.0, gt=0, le=900)
    lambda_concurrency: int = Field(default=4, ge=1, le=256)
    lambda_region: str = "us-east-1"
    lambda_endpoint_url: str | None = None  # moto, LocalStack, a VPC endpoint

    # local[*] (default), or a Spark Connect endpoint sc://host:port of a cluster
    # (docs/spark-cluster.md).
    spark_master: str = "local[*]"
    # Spark settings for operators' sessions (TRACE_SPARK_CONF='{"spark.sql.shuffle.partitions":
    # "8"}'): all of them for a local JVM; on a Spark Connect cluster, the session-level ones
    # (spark.sql.*), the rest being the cluster's own configuration.
    spark_conf: dict[str, str] = Field(default_factory=dict)
    # The operator hosts' JVM compiler profile (spark.JIT_PROFILES): "full" (C2) for large data,
    # "quick" (C1 only, serial GC: half the JVM CPU on small data; `trace demo` uses it).
    spark_jit: Literal["full", "quick"] = "full"

    # Operator isolation. auto: sandboxed when run as root on Linux (own uid, network, PID and
    # mount namespaces), else a warning and reduced isolation; required: refuse to start without
    # the sandbox; off: no sandbox (tests of the wrapper only).
    sandbox: Literal["auto", "required", "off"] = "auto"
    sandbox_user: str = "trace-op"
    # Extra host directories bound read-write into the sandbox at the same path (testing only).
    sandbox_extra_binds: list[Path] = Field(default_factory=list)
    # Per operator host (sandbox/enter.py): cgroup v2 memory.max, pids.max and cpu.max where the
    # worker may make cgroups; else per process RLIMIT_DATA, RLIMIT_NOFILE and RLIMIT_NPROC (the
    # last per OS user: every sandbox of the machine shares it). 0: no limit.
    sandbox_memory_mb: int = Field(default=6144, ge=0)
    sandbox_pids: int = Field(default=4096, ge=0)
    sandbox_cpus: float = Field(default=0.0, ge=0)  # cgroup only (rlimits have no CPU share)
    sandbox_nofile: int = Field(default=8192, ge=0)
    # A cgroup v2 path (under /sys/fs/cgroup) delegated to the worker, holding no process, for
    # the hosts' cgroups; unset: the worker's own cgroup (works only where it may nest them).
    sandbox_cgroup: str | None = None
    # Egress: upstreams that are not public addresses (loopback, private, link-local; a name
    # that does not resolve) an operator may reach anyway, as host[:port], comma-separated; and
    # the most RPC URLs (each a gateway) one task may have.
    egress_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    egress_max_urls: int = Field(default=16, ge=1, le=1024)
    # production: the platform's operators only; testing adds the test operators (noop,
    # emit_events, fail, crash, probe). The aws profile refuses `testing`.
    operator_registry: Literal["production", "testing"] = "production"
    object_store: ObjectStoreBackend = ObjectStoreBackend.local
    object_store_root: Path | None = None
    s3_bucket: str = "trace"
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None

    api_host: str = "127.0.0.1"
    api_port: int = 8765
    api_url: str | None = None
    # The workers' exchange (their claims and completions) on a listener of its own beside the
    # API (api/exchange_listener.py): plain HTTP, the same internal token. The API process
    # serves it on api_host:exchange_port when set; a worker uses exchange_url when set, and
    # the API's own route whenever the listener cannot be reached. Lite sets both.
    exchange_port: int | None = Field(default=None, ge=1, le=65535)
    exchange_url: str | None = None
    # TLS (docs/tls.md). api_tls_cert/api_tls_key (PEM): the API and its exchange listener
    # serve https with them. api_ca_bundle (PEM): the CAs a worker trusts for the API and the
    # listener (default: certifi's). A worker refuses an http:// API or exchange URL that is
    # not loopback (its lease tokens and the internal token would cross the network in clear)
    # unless api_insecure_http is set: only for a private network (deploy/docker-compose.yml).
    api_tls_cert: Path | None = None
    api_tls_key: Path | None = None
    api_ca_bundle: Path | None = None
    api_insecure_http: bool = False
    # The worker registry (docs/workers.md): a worker beats every worker_beat_seconds on a
    # thread of its own; one silent for three beats is declared dead by the reaper and its
    # running attempts are retried at once. worker_host: the host a worker advertises (its id
    # is host:pid:nonce); default its hostname.
    worker_beat_seconds: float = Field(default=5.0, ge=0.05, le=3600)
    worker_host: str | None = Field(default=None, pattern=HOST_NAME)
    # Prometheus metrics (docs/operations.md, "Metrics"): the API serves GET /metrics on
    # metrics_host (default api_host):metrics_port, a worker on
    # worker_metrics_host:worker_metrics_port; unset, not served. No key guards them: bind them
    # where only the operators' network reaches (the figures are every org's together).
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str | None = None
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    worker_metrics_host: str = "127.0.0.1"
    internal_token: SecretStr | None = None
    # required: every user-facing call needs an API key; permissive (Lite only): calls without
    # a key act as the Lite admin. Endpoint shapes are the same either way.
    auth: Literal["required", "permissive"] = "required"
    api_key: SecretStr | None = None  # the CLI's identity (else the key file under `home`)
    # Encrypts secret values at rest (a Fernet key); Lite keeps one in `home/secrets.key`.
    secrets_key: SecretStr | None = None
    scheduler_interval_seconds: float = 1.0

    # Lifecycle defaults a task may override.
    # A lease is three heartbeats: a worker that dies loses its task's lease within 3x the
    # heartbeat interval, and the reaper (every reaper_interval_seconds) retries it at once.
    lease_seconds: float = 15.0
    heartbeat_seconds: float = 5.0
    default_timeout_seconds: int = 3600
    default_max_attempts: int = 3
    retry_backoff_seconds: float = 2.0
    retry_backoff_max_seconds: float = 300.0
    reaper_interval_seconds: float = 1.0
    # How often completed rebuilds are checked for their automatic cutover.
    cutover_interval_seconds: float = 1.0
    # A queued, claimable task untouched this long gets a fresh wake-up (anti-entropy: a
    # wake-up can be dead-lettered, e.g. after the API was down for every delivery).
    rewake_after_seconds: float = 300.0
    worker_visibility_seconds: float = 60.0
    # The Delivery Service (docs/alerts.md): capped, jittered exponential backoff between a
    # delivery's attempts (a receiver's Retry-After is honoured), given up (`failed`) once the
    # delivery is delivery_max_age_seconds old; each attempt times out after
    # delivery_timeout_seconds; a sender's lease on a delivery lasts delivery_lease_seconds.
    delivery_backoff_seconds: float = Field(default=1.0, gt=0)
    delivery_backoff_max_seconds: float = Field(default=300.0, gt=0)
    delivery_max_age_seconds: float = Field(default=86400.0, gt=0)
    delivery_timeout_seconds: float = Field(default=10.0, gt=0)
    delivery_lease_seconds: float = Field(default=60.0, gt=0)
    delivery_poll_seconds: float = Field(default=0.5, gt=0)
    # On SIGTERM a worker takes no new task and lets its running ones finish for this long;
    # then (or at a second signal) it hands them back unfinished: queued again at once, the
    # attempt not counted as a try.
    worker_drain_seconds: float = Field(default=30.0, ge=0)
    # The collector of retired locations (superseded attempts' files, purged versions): how
    # often it runs, how long a retired location is kept at least (a running task may still
    # read an input it was given before a replay superseded it), and locations per batch.
    collector_interval_seconds: float = Field(default=60.0, gt=0)
    collector_grace_seconds: float = Field(default=300.0, ge=0)
    collector_batch_size: int = Field(default=100, ge=1)
    # A dead-lettered buffer batch's artifact is kept this long for its user to look at, then
    # the collector deletes it (a loaded batch's goes after collector_grace_seconds).
    collector_dead_batch_retention_seconds: float = Field(default=7 * 86400.0, ge=0)
    outbox_batch_size: int = 500
    # The most bytes of one buffered-dataset batch the shared sink takes, as stored and as
    # decoded (a Parquet batch's decompressed columns, summed batch by batch as it is read):
    # it sizes the sink's memory, whatever an org declares. A dataset's max_bytes may not be
    # more (refused at deploy).
    sink_max_batch_bytes: int = Field(default=64 * 1024 * 1024, ge=1)

    # Query Service interactive limits (heavier work belongs in a sql_transform job on Spark).
    query_timeout_seconds: float = 30.0
    query_max_rows: int = 10_000
    query_memory_limit: str = "2GB"
    query_export_max_rows: int = 5_000_000
    # Queries run in worker processes (started on demand, reused), never in the API process.
    # Admission (query/admission.py): a query runs only within its user's and its org's share
    # of the workers, else waits in a bounded queue (full, or waited too long: 429 with
    # Retry-After). Keep 2 x per user and per org below query_workers, so that no two users
    # and no one org can hold every worker (a single-org Lite install uses per_org of them).
    query_workers: int = Field(default=4, ge=1)
    query_max_per_user: int = Field(default=1, ge=1)  # running at once; more wait
    query_max_per_org: int = Field(default=3, ge=1)  # running at once; more wait
    query_queue_size: int = Field(default=16, ge=0)  # waiting queries in all
    query_max_queued_per_user: int = Field(default=4, ge=0)  # waiting queries of one user
    # The longest a query waits for its turn; not part of its time limit (execution only).
    query_queue_wait_seconds: float = Field(default=30.0, gt=0)
    query_max_result_bytes: int = Field(default=16 * 1024 * 1024, gt=0)  # Arrow bytes
    query_export_max_result_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    query_threads: int = Field(default=2, ge=1)  # DuckDB threads per query
    # A worker's address space (RLIMIT_AS): its measured baseline + memory_limit + this, which
    # must hold what DuckDB does not count (results, an encoded export, allocator slack).
    query_memory_headroom: str = "1GB"
    # CPU-seconds per query (RLIMIT_CPU); default (timeout + kill grace) * threads.
    query_cpu_seconds: float | None = Field(default=None, gt=0)
    # A worker that has not answered by the time limit plus this is SIGKILLed (and replaced).
    query_kill_grace_seconds: float = Field(default=1.0, gt=0)

    @field_validator("spark_master")
    @classmethod
    def _spark_master(cls, v: str) -> str:
        if v.startswith("sc://"):
            from trace_platform.sandbox.tcp_forward import connect_address

            connect_address(v)  # a ValueError naming the URL
        elif not v.startswith("local"):
            # A classic master's executors could not read what a local Spark stages in the
            # host's workdir, and its driver would need the cluster's network.
            raise ValueError(
                f"TRACE_SPARK_MASTER={v}: use local[*] or a Spark Connect endpoint of the "
                "cluster (sc://host:port); see docs/spark-cluster.md"
            )
        return v

    @field_validator("egress_allow", mode="before")
    @classmethod
    def _egress_allow(cls, v: Any) -> Any:
        if isinstance(v, str):  # "host:port,host2" (or a JSON list)
            v = json.loads(v) if v.strip().startswith("[") else v.split(",")
        if isinstance(v, list):
            from trace_platform.sandbox.gateway import parse_allow

            parse_allow(v)  # a ValueError naming a malformed entry
            return [e.strip() for e in v if e.strip()]
        return v

    @field_validator("spark_conf")
    @classmethod
    def _spark_conf(cls, v: dict[str, str]) -> dict[str, str]:
        return check_user_conf(v)

    @model_validator(mode="after")
    def _profile_defaults(self) -> Settings:
        if self.queue_driver is None:
            self.queue_driver = (
                QueueBackend.sqs if self.profile is Profile.aws else QueueBackend.pgqueue
            )
        if self.profile is Profile.aws and "object_store" not in self.model_fields_set:
            self.object_store = ObjectStoreBackend.s3
        if self.pg_data_dir is None:
            self.pg_data_dir = self.home / "pg"
        if self.object_store_root is None:
            self.object_store_root = self.home / "objects"
        if self.profile is Profile.aws and self.state_dsn is None:
            raise ValueError(
                "TRACE_STATE_DSN is required in the aws profile (no embedded Postgres)"
            )
        if (self.api_tls_cert is None) != (self.api_tls_key is None):
            raise ValueError("TRACE_API_TLS_CERT and TRACE_API_TLS_KEY go together: set both")
        if self.profile is Profile.aws and self.operator_registry == "testing":
            raise ValueError("the aws profile cannot load the test operators")
        if self.profile is Profile.aws and self.auth == "permissive":
            # Key-less calls would act as Lite's admin: behind API Gateway, anyone's.
            raise ValueError("TRACE_AUTH=permissive is Lite's alone: the aws profile requires keys")
        if self.metrics_port is not None and self.metrics_port in (
            self.api_port,
            self.exchange_port,
        ):
            # One listener would fail to bind: say which setting, not an OSError at start.
            raise ValueError(
                f"TRACE_METRICS_PORT={self.metrics_port} is the API's or its exchange "
                "listener's port: give /metrics a port of its own"
            )
        if self.lambda_queue == self.task_queue:
            # Lambda tasks' wake-ups would reach platform workers, which hand them back.
            raise ValueError(
                f"TRACE_LAMBDA_QUEUE must differ from TRACE_TASK_QUEUE ({self.task_queue!r}): "
                "only the Lambda invoker reads it"
            )
        return self

    @property
    def uses_embedded_postgres(self) -> bool:
        return self.state_dsn is None

    @property
    def resolved_api_url(self) -> str:
        scheme = "https" if self.api_tls_cert is not None else "http"
        return self.api_url or f"{scheme}://{url_host(self.api_host)}:{self.api_port}"


_DSN_PASSWORD = re.compile(r"(password=|://[^:/@]+:)([^@\s]+)")


def mask_dsn(dsn: str) -> str:
    return _DSN_PASSWORD.sub(lambda m: m.group(1) + "****", dsn)


def shown(settings: Settings) -> dict[str, Any]:
    """The resolved configuration with every secret masked, for `trace config show`."""
    out: dict[str, Any] = {}
    for name, value in settings.model_dump().items():
        if isinstance(value, SecretStr):
            raw = value.get_secret_value()
            value = mask_dsn(raw) if name.endswith("dsn") else "****"
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, StrEnum):
            value = value.value
        out[name] = value
    out["embedded_postgres"] = settings.uses_embedded_postgres
    out["api_url"] = settings.resolved_api_url
    return out


def adapter_env(settings: Settings) -> dict[str, str]:
    """The profile and queue adapter of `settings` as TRACE_* variables, for the processes one
    stack starts (workers, sinks, Delivery Services): a process on another queue or profile
    than its Dispatcher's would never see a wake-up. The object store's: objectstore.store_env."""
    env = {
        "TRACE_PROFILE": settings.profile.value,
        "TRACE_QUEUE_DRIVER": settings.queue_driver.value if settings.queue_driver else "",
        "TRACE_TASK_QUEUE": settings.task_queue,
        "TRACE_LAMBDA_QUEUE": settings.lambda_queue,
        "TRACE_QUEUE_MAX_ATTEMPTS": str(settings.queue_max_attempts),
        "TRACE_OPERATOR_REGISTRY": settings.operator_registry,
    }
    if settings.queue_driver is QueueBackend.sqs:
        env |= {
            "TRACE_SQS_REGION": settings.sqs_region,
            "TRACE_SQS_QUEUE_PREFIX": settings.sqs_queue_prefix,
            "TRACE_SQS_QUEUE_URLS": json.dumps(settings.sqs_queue_urls),
            "TRACE_SQS_CREATE_QUEUES": str(settings.sqs_create_queues).lower(),
        }
        if settings.sqs_endpoint_url:
            env["TRACE_SQS_ENDPOINT_URL"] = settings.sqs_endpoint_url
        if settings.sqs_access_key_id:
            env["TRACE_SQS_ACCESS_KEY_ID"] = settings.sqs_access_key_id
        if settings.sqs_secret_access_key:
            env["TRACE_SQS_SECRET_ACCESS_KEY"] = settings.sqs_secret_access_key.get_secret_value()
    if settings.internal_token is not None:  # the aws profile's (Lite's is a file under home)
        env["TRACE_INTERNAL_TOKEN"] = settings.internal_token.get_secret_value()
    return {k: v for k, v in env.items() if v}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
