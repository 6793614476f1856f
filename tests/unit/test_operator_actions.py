"""What an operator's action names, checked against the configuration before any SQL."""

from __future__ import annotations

import pytest

from outbox.core.errors import BadRequestError
from outbox.operations.requests import key_of


def test_an_action_names_an_endpoint_unless_its_event_type_has_only_one() -> None:
    endpoints = {"OrderCompleted": ["OrderCompleted"], "InvoicePaid": ["billing", "shipping"]}
    assert key_of(endpoints, "OrderCompleted", None) == ("OrderCompleted", "OrderCompleted")
    assert key_of(endpoints, "InvoicePaid", "shipping") == ("InvoicePaid", "shipping")
    with pytest.raises(BadRequestError, match="endpoint must be an endpoint's name"):
        key_of(endpoints, "InvoicePaid", None)
    with pytest.raises(BadRequestError, match="'audit' is not configured"):
        key_of(endpoints, "InvoicePaid", "audit")
    with pytest.raises(BadRequestError, match="event_type must be an event type"):
        key_of(endpoints, None, "billing")
