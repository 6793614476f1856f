"""How far each of the console list's scans reads (``views.scan_limit``): a page, where the scans
apply every filter given, else the bounded scan a filter no index serves needs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from outbox.operations import views
from outbox.operations.views import MessageFilter

PAGE = 51


@pytest.mark.parametrize(
    "wanted",
    [
        MessageFilter(),
        MessageFilter(status="Pending"),
        MessageFilter(created_from=datetime(2026, 1, 1, tzinfo=UTC)),
        MessageFilter(status="Failed", created_to=datetime(2026, 1, 2, tzinfo=UTC)),
    ],
)
def test_a_list_whose_scans_apply_every_filter_reads_no_more_than_its_page(
    wanted: MessageFilter,
) -> None:
    assert views.scan_limit(wanted, PAGE) == PAGE


@pytest.mark.parametrize(
    "wanted",
    [
        MessageFilter(event_type="OrderPlaced"),
        MessageFilter(endpoint="shipping", endpoint_of=["OrderShipped"]),
        MessageFilter(status="Pending", ordering_key="customer-1"),
        MessageFilter(error="HTTP 503"),
    ],
)
def test_a_filter_no_index_serves_reads_the_bounded_scan(wanted: MessageFilter) -> None:
    assert views.scan_limit(wanted, PAGE) == views.CONSOLE_SCAN_LIMIT
