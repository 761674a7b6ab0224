"""A dataset its caller may not read does not exist for them, in deploy and dry-run answers
too: no status, text or producer's name tells it from a name nobody uses (issue 38, Low)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.dags import user
from trace_platform.services import Services

PRIVATE = "name: alices_secret_dag\njobs:\n  a: {operator: noop, outputs: [{}]}\npublish:\n  - {job: a, output_index: 0, dataset: alice_private}\n"
READER = "name: bobs\njobs:\n  r: {{operator: noop, inputs: [{{from: {{dataset: {name}}}}}]}}\n"
PUBLISHER = (
    "name: bobs\njobs:\n  p: {{operator: noop, outputs: [{{}}]}}\n"
    "publish:\n  - {{job: p, output_index: 0, dataset: {name}}}\n"
)


def _deploy(url: str, key: str, yaml: str, dry_run: bool) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/dags",
        params={"dry_run": str(dry_run).lower()},
        json={"yaml": yaml},
        headers={"Authorization": f"Bearer {key}"},
    )


@pytest.mark.parametrize("dry_run", [True, False])
def test_reading_anothers_private_dataset_answers_as_an_unknown_one(
    secure: tuple[Services, str], dry_run: bool
) -> None:
    svc, url = secure
    alice, _ = user(svc, "alice")
    svc.control.deploy(alice, PRIVATE)  # a no-role user's DAG: its dataset is private
    _, bob_key = user(svc, "bob")
    hidden = _deploy(url, bob_key, READER.format(name="alice_private"), dry_run)
    unknown = _deploy(url, bob_key, READER.format(name="nobody_a_name"), dry_run)
    assert unknown.status_code == 422, unknown.text
    assert hidden.status_code == unknown.status_code, hidden.text
    expected = unknown.text.replace("nobody_a_name", "alice_private")
    assert hidden.text == expected
    # Nothing was deployed either way.
    assert (
        httpx.get(f"{url}/v1/dags/bobs", headers={"Authorization": f"Bearer {bob_key}"}).status_code
        == 404
    )


def test_a_name_taken_by_a_private_dag_does_not_name_that_dag(
    secure: tuple[Services, str],
) -> None:
    svc, url = secure
    alice, _ = user(svc, "alice")
    svc.control.deploy(alice, PRIVATE)
    _, bob_key = user(svc, "bob")
    taken = _deploy(url, bob_key, PUBLISHER.format(name="alice_private"), True)
    assert taken.status_code == 422, taken.text
    assert "alices_secret_dag" not in taken.text and "produced by another DAG" in taken.text
    # Whoever may read the dataset (its owner) is told which DAG produces it.
    alices_key = user(svc, "alice")[1]
    own = _deploy(url, alices_key, PUBLISHER.format(name="alice_private"), True)
    assert "produced by DAG 'alices_secret_dag'" in own.text
