"""Outbound safety and signing of the Delivery Service, without a network: which addresses a
webhook may go to (checked when it is sent, and sent to exactly the address checked), and
signatures a `standardwebhooks` receiver accepts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from trace_platform.delivery import safety, signing


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.org/x", "only http and https"),
        ("http://user:pw@93.184.216.34/x", "no credentials"),
        ("http://127.0.0.1:8080/x", "loopback"),
        ("http://[::1]/x", "loopback"),
        ("http://[::ffff:127.0.0.1]/x", "loopback"),
        ("http://10.1.2.3/x", "private"),
        ("http://192.168.0.10/x", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://0.0.0.0/x", "unspecified"),
        ("http://localhost/x", "loopback"),
    ],
)
def test_internal_addresses_are_refused_unless_allowed(url: str, why: str) -> None:
    with pytest.raises(safety.Refused, match=why):
        safety.resolve(url, allow_private=False)
    if "://" in url and url.startswith("http") and "@" not in url:
        target = safety.resolve(url, allow_private=True)  # an admin allowed this destination
        assert target.address in target.url  # sent to exactly the address checked


def test_a_public_address_is_sent_to_as_checked() -> None:
    t = safety.resolve("https://93.184.216.34:8443/hook?x=1", allow_private=False)
    assert (t.address, t.port, t.scheme) == ("93.184.216.34", 8443, "https")
    assert t.url == "https://93.184.216.34:8443/hook?x=1"


def test_signatures_verify_with_the_standardwebhooks_package() -> None:
    secret = signing.new_secret()
    body = '{"type":"alert","n":1}'
    h = signing.headers(secret, "alert_abc", body)
    assert h["webhook-id"] == "alert_abc" and h["webhook-signature"].startswith("v1,")
    Webhook(secret).verify(body, h)  # raises if wrong
    with pytest.raises(WebhookVerificationError):
        Webhook(signing.new_secret()).verify(body, h)  # another secret: forged
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace("1", "2"), h)  # another body
    old = signing.headers(secret, "alert_abc", body, datetime.now(UTC) - timedelta(hours=1))
    with pytest.raises(WebhookVerificationError):  # a replay long after: too old
        Webhook(secret).verify(body, old)


TRUSTED_CONFIGS = {"alert_route": "{routes: [{destination: ops}]}", "hot_window": "{}"}


@pytest.mark.parametrize("operator", sorted(TRUSTED_CONFIGS))
def test_a_trusted_operator_is_refused_on_any_runtime_but_the_platforms(operator: str) -> None:
    """A trusted operator given another runtime would run in the untrusted host with its
    slot's env (a TRACE_SINK_DSN of the DAG's choosing) and still be a writer of
    alert_deliveries: refused at validation, naming the runtime."""
    from trace_platform.dag.validate import DagInvalid, parse

    def dag(runtime: str) -> str:
        return (
            f"name: x\njobs:\n  j:\n    operator: {operator}\n    runtime: {runtime}\n"
            f"    config: {TRUSTED_CONFIGS[operator]}\n"
        )

    with pytest.raises(DagInvalid, match=r"jobs.j.runtime: .* runs only as runtime ecs_platform"):
        parse(dag("ecs_user"))
    parse(dag("ecs_platform"))


def test_a_huge_destination_url_is_refused_before_it_is_parsed_or_stored() -> None:
    with pytest.raises(safety.Refused, match="longer than"):
        safety.check_url("https://hooks.example.org/" + "x" * (1 << 20))
    assert safety.check_url("https://hooks.example.org/" + "x" * 1000)[1] == "hooks.example.org"
