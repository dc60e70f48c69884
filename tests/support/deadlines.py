"""A whole-request deadline for the tests that call ``ServiceClient.request`` themselves."""

import functools
from datetime import timedelta

from tasks.clients.bounds import Deadline

A_MINUTE = functools.partial(Deadline, timedelta(minutes=1), "the test's deadline")
