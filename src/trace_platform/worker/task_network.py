"""What an attempt's operator may reach over the network: the platform's own ports it never may,
the RPC upstreams TRACE_EGRESS_ALLOW lets it (through gateways in the sandbox), a trusted
sink's database and a Spark Connect endpoint (through forwards)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trace_platform.config import Settings
from trace_platform.contract import TaskPayload
from trace_platform.operators import CLUSTER_OPERATORS
from trace_platform.sandbox.gateway import (
    Allow,
    EgressRefused,
    Gateways,
    check_all,
    check_upstream,
    host_port,
    is_url,
    parse_allow,
)
from trace_platform.sandbox.tcp_forward import TcpForward, connect_address
from trace_platform.worker.operator_host import OperatorHost


def platform_ports(settings: Settings, api_urls: list[str | None], dsns: list[str]) -> set[int]:
    """Loopback ports of the platform's own services (the API's, its exchange listener's, the
    API's and this worker's /metrics, the object store's, Postgres'): no operator egress may
    reach them."""
    ports = {settings.api_port}
    for port in (settings.exchange_port, settings.metrics_port, settings.worker_metrics_port):
        if port is not None:
            ports.add(port)
    urls = (*api_urls, settings.exchange_url, settings.s3_endpoint_url)
    ports.update(host_port(url)[1] for url in urls if url)
    for dsn in dsns:
        with contextlib.suppress(psycopg.Error, ValueError):
            spec = str(conninfo_to_dict(dsn).get("port") or "")  # "5432,5433": one per host
            ports.update(int(p) if p else 5432 for p in spec.split(","))
    return ports


DEVNET = "devnet"  # in TRACE_EGRESS_ALLOW: this Trace home's devnet node (see egress_allowed)


def devnet_node(home: Path) -> tuple[str, int] | None:
    """The devnet node's (host, port), from `trace devnet`'s node file, while its process runs."""
    try:
        raw = json.loads((home / "devnet" / "node.json").read_text())
        pid, port = int(raw["pid"]), int(raw["port"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return "127.0.0.1", port


def tcp_address(dsn: str) -> tuple[str, int] | None:
    """Where a DSN's (first) server listens over TCP; None: a Unix socket, or no host at all."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return None
    host = str(params.get("hostaddr") or params.get("host") or "").split(",")[0]
    if not host or host.startswith("/") or host.startswith("@"):
        return None
    port = str(params.get("port") or "").split(",")[0]
    return host, int(port) if port else 5432


def task_urls(task: TaskPayload, env: dict[str, str]) -> set[str]:
    """Every RPC URL the task may use: its env's (slot env, secrets) and config.rpc_url."""
    urls = {v for v in env.values() if is_url(v)}
    rpc = task.config.get("rpc_url")
    if isinstance(rpc, str) and is_url(rpc):
        urls.add(rpc)
    return urls


class TaskNetwork:
    """The wrapper's network side of an attempt (a mixin of `Wrapper`, whose settings it reads):
    every RPC URL checked and, in the sandbox, given a gateway on the host's loopback; a trusted
    sink's DSN and a Spark Connect master given forwards."""

    home: Path
    platform_ports: set[int]
    egress_allow: list[str]
    egress_devnet: bool
    egress_max_urls: int
    spark_master: str
    trusted_host: OperatorHost

    def egress_allowed(self) -> Allow:
        """TRACE_EGRESS_ALLOW's upstreams; `devnet` in it (the Lite stack's): this Trace home's
        devnet node, at its address while it runs (it may start after the worker)."""
        allow = parse_allow(self.egress_allow)
        if self.egress_devnet and (node := devnet_node(self.home)) is not None:
            allow |= {node}
        return allow

    def _egress(
        self,
        host: OperatorHost,
        task: TaskPayload,
        env: dict[str, str],
        gateways: list[Gateways | TcpForward],
    ) -> tuple[TaskPayload, dict[str, str]]:
        """Every RPC URL the task may use (slot env and secrets, config.rpc_url) is checked,
        at most `egress_max_urls` of them; in the sandbox they become gateways on the host's
        own loopback, to the addresses checked."""
        urls = task_urls(task, env)
        rpc = task.config.get("rpc_url")
        if len(urls) > self.egress_max_urls:
            # Before any name is resolved: each is a DNS query, and each a gateway.
            raise EgressRefused(
                f"the task has {len(urls):,} RPC URLs (http(s) values in its worker pool slot's "
                f"env and secrets, and config.rpc_url); at most {self.egress_max_urls} per task "
                "(TRACE_EGRESS_MAX_URLS)"
            )
        if not urls:
            return task, env
        allow = self.egress_allowed()
        checked = check_all(urls, self.platform_ports, allow)
        if not host.policy.isolated:
            return task, env
        group = Gateways(self.platform_ports, allow)
        gateways.append(group)
        local = {url: group.add(host.listen(), up) for url, up in sorted(checked.items())}
        env = {k: local.get(v, v) for k, v in env.items()}
        if isinstance(rpc, str) and rpc in local:
            task = task.model_copy(update={"config": {**task.config, "rpc_url": local[rpc]}})
        return task, env

    def _sink_forward(
        self,
        host: OperatorHost,
        task: TaskPayload,
        env: dict[str, str],
        forwards: list[Gateways | TcpForward],
    ) -> dict[str, str]:
        """A trusted sink's env in the sandbox: its DSN pointed at a forward, on the host's own
        loopback for this run only, to the server's address (the DSN keeps its host name, for
        TLS verification)."""
        dsn = env.get("TRACE_SINK_DSN")
        if dsn is None or host is not self.trusted_host or not host.policy.isolated:
            return env
        address = tcp_address(dsn)
        if address is None:
            raise RuntimeError("the sink DSN has no TCP address to forward into the sandbox")
        fwd = TcpForward(host.listen(), *address)
        forwards.append(fwd)
        params = conninfo_to_dict(dsn)
        name = str(params.get("host") or "").split(",")[0] or "127.0.0.1"
        params.update(host=name, hostaddr="127.0.0.1", port=str(fwd.port))
        return {**env, "TRACE_SINK_DSN": make_conninfo(**params)}

    def _spark_remote(
        self, host: OperatorHost, task: TaskPayload, forwards: list[Gateways | TcpForward]
    ) -> str | None:
        """The Spark Connect URL the task's operator uses, when the configured master is one
        (`sc://`) and the operator may run on the cluster (CLUSTER_OPERATORS): in the sandbox,
        a forward from the host's own loopback to that endpoint."""
        if not self._spark_forwarded(task):
            return None
        name, port, rest = connect_address(self.spark_master)
        # The worker's own setting, not a task's: allowed wherever it is, but never a platform port.
        check_upstream(
            f"http://{name}:{port}/", self.platform_ports, parse_allow([f"{name}:{port}"])
        )
        if not host.policy.isolated:
            return self.spark_master
        fwd = TcpForward(host.listen(), name, port)
        forwards.append(fwd)
        return f"sc://127.0.0.1:{fwd.port}{rest}"

    def _spark_forwarded(self, task: TaskPayload) -> bool:
        return self.spark_master.startswith("sc://") and task.operator in CLUSTER_OPERATORS
