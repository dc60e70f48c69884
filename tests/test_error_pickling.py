"""An error raised in a Dask worker reaches the flow process pickled (distributed uses tblib, which keeps the chain of
causes): every dupflow error comes back whole, whatever its constructor takes. A TransactionRejected came back as
"TypeError: TransactionRejected.__init__() missing 1 required positional argument", the rejected batch unsaid."""

from __future__ import annotations

import pickle

import httpx
import pytest
from tblib import pickling_support

from tasks.clients.errors import ServiceError
from tasks.clients.extraction_jobs import SearchRejectedError
from tasks.clients.fhir_server import TransactionRejected
from tasks.core.errors import DupflowError, StepError
from tasks.streams.files import JobWriteError
from tasks.streams.ndjson import LineTooLongError


def rejected() -> TransactionRejected:
    response = httpx.Response(200, content=b"{}", request=httpx.Request("POST", "http://fhir.example/fhir"))
    return TransactionRejected(response, "entry 1 failed with 422", failed_entry=0, outcome="bad code")


ERRORS = {
    "ServiceError": lambda: ServiceError("transaction", 503, "busy", transient=True, service="FHIR server"),
    "TransactionRejected": rejected,
    "SearchRejectedError": lambda: SearchRejectedError(["unknown status"]),
    "LineTooLongError": lambda: LineTooLongError("/x/a.ndjson", 3, 1024),
    "JobWriteError": lambda: JobWriteError("no space left on /jobs: cannot write a.ndjson"),
    "StepError": lambda: StepError("a.ndjson: batch 1 was rejected", status_code=422),
}


def raised_from(cause: DupflowError) -> StepError:
    try:
        try:
            raise cause
        except DupflowError as exc:
            raise StepError("send failed") from exc
    except StepError as error:
        return error


@pytest.mark.parametrize("made", ERRORS.values(), ids=ERRORS.keys())
@pytest.mark.parametrize("tblib", [False, True], ids=["pickle", "tblib"])
def test_every_error_comes_back_from_a_pickle_whole(made, tblib):
    if tblib:
        pickling_support.install()  # what distributed does; it registers the classes known at that moment
    error = made()
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.__dict__ == error.__dict__
    chained = pickle.loads(pickle.dumps(raised_from(made())))
    assert str(chained) == "send failed"
    if tblib:
        assert type(chained.__cause__) is type(error) and str(chained.__cause__) == str(error)


def test_no_error_class_takes_its_pickling_from_elsewhere():
    """A subclass with its own ``__reduce__`` would be pickled through its constructor again."""

    def subclasses(cls: type) -> list[type]:
        return [cls, *(sub for direct in cls.__subclasses__() for sub in subclasses(direct))]

    assert {cls.__reduce__ for cls in subclasses(DupflowError)} == {DupflowError.__reduce__}
