"""What an operator's action names, checked against the configuration before any SQL."""

from __future__ import annotations

import pytest

from outbox.core.errors import BadRequestError, NotFoundError
from outbox.operations.requests import key_of


def test_an_action_names_an_endpoint_unless_its_event_type_has_only_one() -> None:
    endpoints = {"OrderCompleted": ["OrderCompleted"], "InvoicePaid": ["billing", "shipping"]}
    assert key_of(endpoints, "OrderCompleted", None) == ("OrderCompleted", "OrderCompleted")
    assert key_of(endpoints, "InvoicePaid", "shipping") == ("InvoicePaid", "shipping")
    with pytest.raises(BadRequestError, match=r"endpoint must be one of billing, shipping \("):
        key_of(endpoints, "InvoicePaid", None)
    with pytest.raises(BadRequestError, match="event_type must be an event type"):
        key_of(endpoints, None, "billing")
    with pytest.raises(BadRequestError, match="endpoint must be an endpoint's name"):
        key_of(endpoints, "InvoicePaid", 7)


def test_an_unknown_event_type_or_endpoint_is_not_found_and_the_configured_ones_are_listed() -> (
    None
):
    endpoints = {"OrderCompleted": ["OrderCompleted"], "InvoicePaid": ["billing", "shipping"]}
    with pytest.raises(NotFoundError) as unknown_type:
        key_of(endpoints, "NoSuchType", None)
    assert str(unknown_type.value) == (
        "no endpoint of event type 'NoSuchType' (configured: OrderCompleted, InvoicePaid)"
    )
    with pytest.raises(NotFoundError) as unknown_endpoint:
        key_of(endpoints, "InvoicePaid", "audit")
    assert str(unknown_endpoint.value) == (
        "no endpoint 'audit' of event type 'InvoicePaid' (configured: billing, shipping)"
    )
