"""The fake FHIR server's wire behaviour and fault switches, checked with a bare httpx client."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes._server import LoopbackServer
from tests.fakes.fhir_server import start_fhir_fake
from tests.fakes.oauth import OAuthHandler, OAuthState

TRANSACTION = {
    "resourceType": "Bundle",
    "type": "transaction",
    "entry": [
        {"resource": {"resourceType": "Patient", "id": "p1"}, "request": {"method": "PUT", "url": "Patient/p1"}},
        {
            "resource": {"resourceType": "Observation"},
            "request": {"method": "POST", "url": "Observation", "ifNoneExist": "_tag=s|c"},
        },
    ],
}


@pytest.fixture(scope="module")
def server():
    fake = start_fhir_fake()
    yield fake
    fake.stop()


@pytest.fixture
def fake(server):
    server.state.reset()
    return server


def post(fake, body=TRANSACTION, **headers) -> httpx.Response:
    return httpx.post(f"{fake.base_url}/fhir", json=body, headers=headers, timeout=10)


def test_a_transaction_gets_a_transaction_response_and_is_recorded(fake):
    response = post(fake)

    assert response.status_code == 200
    bundle = response.json()
    assert bundle["type"] == "transaction-response"
    assert [e["response"]["status"] for e in bundle["entry"]] == ["201 Created", "201 Created"]
    assert fake.state.applied == {"Patient/p1": 1, "Observation?_tag=s|c": 1}


def test_a_503_storm_ends_after_its_count(fake):
    fake.state.unavailable = 2

    statuses = [post(fake).status_code for _ in range(3)]

    assert statuses == [503, 503, 200]
    assert fake.state.applied == {"Patient/p1": 1, "Observation?_tag=s|c": 1}


def test_a_reset_mid_response_applies_the_transaction_but_never_answers(fake):
    fake.state.reset_mid_response = 1

    with pytest.raises(httpx.TransportError):
        post(fake)

    assert fake.state.applied["Patient/p1"] == 1
    assert post(fake).status_code == 200


def test_a_failed_entry_comes_inside_a_200_answer_and_nothing_is_applied(fake):
    fake.state.fail_entry, fake.state.fail_entry_once = 1, True

    failed, later = post(fake), post(fake)

    entries = failed.json()["entry"]
    assert failed.status_code == 200
    assert entries[1]["response"]["status"].startswith("422")
    assert entries[1]["response"]["outcome"]["issue"][0]["diagnostics"].endswith("profile validation failed")
    assert [e["response"]["status"] for e in later.json()["entry"]] == ["201 Created", "201 Created"]
    assert fake.state.applied == {"Patient/p1": 1, "Observation?_tag=s|c": 1}


def test_a_body_over_the_limit_is_413_with_an_operation_outcome_and_nothing_is_applied(fake):
    fake.state.max_body_bytes = 100

    refused = post(fake)
    put = httpx.put(f"{fake.base_url}/fhir/Binary/b1", content=b"x" * 101, timeout=10)

    assert (refused.status_code, put.status_code) == (413, 413)
    assert refused.json()["issue"][0]["code"] == "too-costly"
    assert not fake.state.applied and not fake.state.transactions
    assert [r["refused"] for r in fake.state.requests] == [413, 413]


def test_put_counts_the_body_and_says_created_then_updated(fake):
    first = httpx.put(f"{fake.base_url}/fhir/Binary/b1", content=b"x" * 5000, timeout=10)
    second = httpx.put(f"{fake.base_url}/fhir/Binary/b1", content=b"y" * 10, timeout=10)

    assert (first.status_code, second.status_code) == (201, 200)
    assert fake.state.put_bytes == {"Binary/b1": 10}
    assert fake.state.applied["Binary/b1"] == 2


def test_with_oauth_only_a_currently_valid_token_passes(fake):
    oauth = OAuthState()
    fake.state.oauth = oauth
    with LoopbackServer(OAuthHandler, oauth):
        token = oauth.issue_token()

        assert post(fake).status_code == 401
        assert post(fake, Authorization=f"Bearer {token}").status_code == 200
        oauth.revoke_all()
        assert post(fake, Authorization=f"Bearer {token}").status_code == 401
