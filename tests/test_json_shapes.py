"""Every reader of someone else's JSON (a service's answer, a data line) takes an array only where one is, and an
object only where one is: a number failed with a bare TypeError, a string was read character by character."""

from __future__ import annotations

import orjson
import pytest

from tasks.clients.errors import operation_outcome_texts
from tasks.clients.flattener import lists_view_run
from tasks.clients.pseudonymizer import PseudonymizationError, checked_answer
from tasks.clients.validator import read_findings
from tasks.core.errors import StepError
from tasks.clients.transaction_bundles import SEND_ENTRY_TAG_SYSTEM, transaction_entry

SHAPES = [5, "ab", True, {"a": 1}, [1], [[1]], ["x", None]]


@pytest.mark.parametrize("entry", ["ab", 2, {"resource": {}}], ids=repr)
def test_a_pseudonymized_bundle_whose_entry_is_no_array_is_refused_not_counted_by_its_characters(entry):
    sent = {"resourceType": "Bundle", "id": "b", "entry": [{"resource": {"resourceType": "Patient"}}] * 2}
    answer = orjson.dumps({"resourceType": "Bundle", "id": "x", "entry": entry})  # "ab" had the length of 2 entries
    with pytest.raises(PseudonymizationError, match="answered with a Bundle whose entry is not an array for 2 sent"):
        checked_answer(answer, sent)


def capability_statements(value):
    """A CapabilityStatement with ``value`` at each place the client looks for ``$run``."""
    rests = [value, [{"resource": value}], [{"resource": [{"type": "ViewDefinition", "operation": value}]}]]
    return [{"resourceType": "CapabilityStatement", "rest": rest} for rest in [*rests, [{"operation": value}]]]


@pytest.mark.parametrize("value", SHAPES, ids=repr)
def test_answers_of_another_shape_mean_nothing_to_the_clients_that_read_them(value):
    assert [lists_view_run(statement) for statement in capability_statements(value)] == [False] * 4
    outcome = {"resourceType": "OperationOutcome", "issue": value}
    assert operation_outcome_texts(orjson.dumps(outcome)) == []
    counted = read_findings(outcome, ("Patient/p",), keep=10)
    assert (counted.errors, counted.warnings) == (0, 0)
    severities = read_findings({"issue": [{"severity": value, "diagnostics": "d"}]}, ("Patient/p",), keep=10)
    assert severities.errors == 0 and severities.information == 1


@pytest.mark.parametrize("meta", [5, "ab", {"tag": 5}, {"tag": "ab"}], ids=repr)
def test_a_resource_without_an_id_whose_meta_cannot_take_the_tag_is_refused_naming_its_line(meta):
    """Its tag is how a resend finds it (a conditional create): a string of tags was taken apart into characters."""
    with pytest.raises(StepError, match="^a.ndjson line 1: the resource's meta is not an object with a tag array"):
        transaction_entry({"resourceType": "Patient", "meta": meta}, None, "t:1", "a.ndjson line 1")
    entry, label = transaction_entry({"resourceType": "Patient", "meta": {"tag": [{"code": "x"}]}}, None, "t:1", "w")
    assert label == "Patient (no id)"
    assert [t.get("system") for t in orjson.loads(entry)["resource"]["meta"]["tag"]] == [None, SEND_ENTRY_TAG_SYSTEM]
