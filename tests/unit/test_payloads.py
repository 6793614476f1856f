from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from outbox.core.errors import InvalidMessageError
from outbox.producer.core import check_event_type, check_ordering_key, serialise_payload


class Order(BaseModel):
    order_id: int
    placed_at: dt.datetime


class Reading(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")
    value: float


class Note(BaseModel):
    text: str = ""
    extra: dict[str, Any] = {}


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Line:
    sku: str
    qty: int


def test_dicts_serialise_to_a_json_object() -> None:
    assert json.loads(serialise_payload({"orderId": 1, "tags": ["a"]})) == {
        "orderId": 1,
        "tags": ["a"],
    }


def test_pydantic_models_serialise_with_pydantic() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    text = serialise_payload(Order(order_id=7, placed_at=when))
    assert json.loads(text) == {"order_id": 7, "placed_at": "2026-01-02T03:04:05Z"}


def test_common_python_types_inside_a_dict_are_encoded() -> None:
    ident = uuid.UUID(int=5)
    text = serialise_payload(
        {
            "id": ident,
            "on": dt.date(2026, 1, 2),
            "amount": decimal.Decimal("10.10"),
            "colour": Colour.RED,
            "line": Line("sku-1", 2),
        }
    )
    assert json.loads(text) == {
        "id": str(ident),
        "on": "2026-01-02",
        "amount": "10.10",
        "colour": "red",
        "line": {"sku": "sku-1", "qty": 2},
    }


def test_non_ascii_text_is_kept_readable() -> None:
    assert "注文" in serialise_payload({"name": "注文"})


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"x": object()}, "not JSON-serialisable: Object of type object"),
        ({"x": float("nan")}, "not JSON-serialisable: Out of range float values"),
        ({"x": {1, 2}}, "not JSON-serialisable: Object of type set"),
        ([1, 2], "must be a dict or a pydantic model, not list"),
        ("text", "must be a dict or a pydantic model, not str"),
        (None, "must be a dict or a pydantic model, not NoneType"),
        ({"x": "a\x00b"}, "NUL character"),
        ({"x": "\\\x00"}, "NUL character"),
        ({"a\x00b": 1}, "NUL character"),
    ],
)
def test_unstorable_payloads_raise_a_clear_error(payload: object, expected: str) -> None:
    with pytest.raises(InvalidMessageError, match=expected.replace("(", r"\(")):
        serialise_payload(payload)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["C:\\u0000x", "\\\\u0000", "\\\\\\u0000"])
def test_a_literal_backslash_u0000_is_text_not_a_nul(text: str) -> None:
    assert json.loads(serialise_payload({"path": text})) == {"path": text}


def test_circular_payload_raises_a_clear_error() -> None:
    payload: dict[str, object] = {}
    payload["self"] = payload
    with pytest.raises(InvalidMessageError, match="Circular reference"):
        serialise_payload(payload)


def test_infinity_in_a_model_is_refused_rather_than_written_as_invalid_json() -> None:
    with pytest.raises(InvalidMessageError, match="not JSON-serialisable: Out of range float"):
        serialise_payload(Reading(value=float("inf")))


@pytest.mark.parametrize(
    "payload",
    [{"name": "a\udcffb"}, {"a\udcffb": 1}, Note(text="a\udcffb")],
    ids=["dict value", "dict key", "model"],
)
def test_a_lone_surrogate_in_the_payload_is_refused(payload: Any) -> None:
    with pytest.raises(InvalidMessageError, match=r"payload contains a surrogate \(U\+DCFF\)"):
        serialise_payload(payload)


def nested(depth: int) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    for _ in range(depth):
        payload = {"a": payload}
    return payload


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        # Deep enough that every supported Python refuses it (3.13 encodes 3,000 levels).
        (nested(10_000), "payload is nested too deeply"),
        (Note(extra=nested(3000)), "not JSON-serialisable: Maximum serialization depth exceeded"),
    ],
    ids=["dict", "model"],
)
def test_a_deeply_nested_payload_is_refused(payload: Any, expected: str) -> None:
    with pytest.raises(InvalidMessageError, match=expected):
        serialise_payload(payload)


def test_payload_over_the_limit_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match=r"payload is \d+ bytes, above the limit of 1024"):
        serialise_payload({"blob": "x" * 2000}, max_bytes=1024)


@pytest.mark.parametrize("event_type", ["", "   ", None, 5, " padded", "x" * 201])
def test_bad_event_types_are_refused(event_type: object) -> None:
    with pytest.raises(InvalidMessageError, match="event_type must be"):
        check_event_type(event_type)


def test_an_event_type_with_a_nul_character_is_refused_by_name() -> None:
    with pytest.raises(InvalidMessageError, match=r"event_type contains a NUL character"):
        check_event_type("Order\x00Placed")


@pytest.mark.parametrize(
    ("check", "name"), [(check_event_type, "event_type"), (check_ordering_key, "ordering_key")]
)
def test_text_fields_with_a_lone_surrogate_are_refused_by_name(
    check: Callable[[object], None], name: str
) -> None:
    with pytest.raises(InvalidMessageError, match=rf"{name} contains a surrogate \(U\+DCFF\)"):
        check("Order\udcffX")


@pytest.mark.parametrize(
    ("check", "name"), [(check_event_type, "event_type"), (check_ordering_key, "ordering_key")]
)
@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("Evil\nERROR outbox.drain: FORGED LINE", "U+000A"),
        ("Order\x1b[2JPlaced", "U+001B"),
        ("Order\x07", "U+0007"),
        ("Order\u202ePlaced", "U+202E"),  # right-to-left override
    ],
)
def test_text_fields_with_control_characters_are_refused_by_name(
    check: Callable[[object], None], name: str, value: str, code: str
) -> None:
    expected = re.escape(f"{name} contains a control character ({code})")
    with pytest.raises(InvalidMessageError, match=expected):
        check(value)


# Written with joiners: an emoji ZWJ sequence (woman, ZWJ, laptop), one with a skin tone and a
# variation selector, a Persian word with a ZWNJ ("I want"), Hindi with a ZWJ, Hindi with a ZWNJ.
JOINED_NAMES = [
    "\U0001f469\u200d\U0001f4bb",
    "Badge\U0001f3f3\ufe0f\u200d\U0001f308",
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
    "\u0915\u094d\u200d\u0937",
    "\u0915\u094d\u200c\u0937",
]


@pytest.mark.parametrize(
    ("check", "name"), [(check_event_type, "event_type"), (check_ordering_key, "ordering_key")]
)
@pytest.mark.parametrize("value", JOINED_NAMES)
def test_text_fields_written_with_zero_width_joiners_are_accepted(
    check: Callable[[object], None], name: str, value: str
) -> None:
    check(value)


@pytest.mark.parametrize(
    ("check", "name"), [(check_event_type, "event_type"), (check_ordering_key, "ordering_key")]
)
@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("Order\u202aPlaced", "U+202A"),  # left-to-right embedding
        ("\u0645\u202d\u06cc", "U+202D"),  # left-to-right override, between Persian letters
        ("Order\u2066Placed\u2069", "U+2066"),  # left-to-right isolate
        ("Order\u2069Placed", "U+2069"),  # pop directional isolate
        ("Order\u200bPlaced", "U+200B"),  # zero width space
        ("\u0645\u200b\u06cc", "U+200B"),  # ... also between letters beyond ASCII
        ("\ufeffOrderPlaced", "U+FEFF"),  # byte order mark
        ("Order\x85Placed", "U+0085"),  # C1: next line
        ("Order\x9bPlaced", "U+009B"),  # C1: control sequence introducer
        ("Order\x7fPlaced", "U+007F"),
        ("\U0001f469\u200d\U0001f4bb\u202e", "U+202E"),  # a joined name, then an override
    ],
)
def test_text_fields_with_bidi_controls_zero_width_spaces_and_c1_controls_are_refused(
    check: Callable[[object], None], name: str, value: str, code: str
) -> None:
    expected = re.escape(f"{name} contains a control character ({code})")
    with pytest.raises(InvalidMessageError, match=expected):
        check(value)


@pytest.mark.parametrize(
    ("check", "name"), [(check_event_type, "event_type"), (check_ordering_key, "ordering_key")]
)
@pytest.mark.parametrize(
    ("value", "code", "kind"),
    [
        ("Order\u200dCompleted", "U+200D", "joiner"),  # looks like OrderCompleted
        ("OrderCompleted\u200c", "U+200C", "non-joiner"),
        ("\u200d\U0001f4bb", "U+200D", "joiner"),
        ("\U0001f469\u200d", "U+200D", "joiner"),
        ("\U0001f469\u200d\u200d\U0001f4bb", "U+200D", "joiner"),
        ("\u0645\u200c\u200b\u06cc", "U+200C", "non-joiner"),
        ("\u200c", "U+200C", "non-joiner"),
    ],
)
def test_text_fields_with_a_joiner_that_joins_nothing_are_refused_by_name(
    check: Callable[[object], None], name: str, value: str, code: str, kind: str
) -> None:
    expected = re.escape(f"{name} contains a zero width {kind} ({code}) that joins no two")
    with pytest.raises(InvalidMessageError, match=expected):
        check(value)


def test_a_generated_id_is_inserted_without_looking_for_a_conflict() -> None:
    """A random UUID made here cannot be in the table: no ON CONFLICT (one WAL record less per
    message); an id the caller gives is checked (outbox_insert_message, migration 0019, or the
    partitioned layout's), and a duplicate reported."""
    import uuid

    from outbox.producer.core import prepare
    from outbox.store.partitions import layout

    _, generated = prepare("OrderCompleted", {"n": 1}, None, None, None)
    given, statement = prepare("OrderCompleted", {"n": 1}, uuid.uuid4(), None, None)
    assert generated.name == "insert_new_message"
    assert "DO NOTHING" not in generated.sql
    assert statement.name == "insert_message"
    assert "outbox_insert_message($1, $2, $3::jsonb, $4::text, $5::jsonb)" in statement.sql
    assert "ON CONFLICT (outbox_message_id) DO NOTHING" in _migration_0019()
    assert "ON CONFLICT (outbox_message_id) DO NOTHING" in layout.PLAIN_INSERT
    assert "INSERT INTO outbox_message_ids" in layout.PARTITIONED_INSERT
    assert "DO NOTHING;\n    IF NOT FOUND THEN" in layout.PARTITIONED_INSERT
    assert layout.NO_CONFLICT not in layout.PARTITIONED_INSERT
    assert statement.args[0] == given


def _migration_0019() -> str:
    from outbox.store.migrate import MIGRATIONS_DIR

    return MIGRATIONS_DIR.joinpath("0019_insert_message_function.sql").read_text()


def _insert(sql: str) -> str:
    """The INSERT's columns and values, parameters named alike, without spaces or comments."""
    import re

    body = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--"))
    start = body.index("INSERT INTO outbox_messages")
    end = body.index("RETURNING", start)
    text = body[start:end].split("ON CONFLICT")[0].replace(" AS m", "")
    for number, name in enumerate(
        ("p_id", "p_event_type", "p_payload", "p_ordering_key", "p_trace_context"), 1
    ):
        text = re.sub(rf"\${number}(::\w+)?\b", name, text)
    return re.sub(r"\s+", "", text)


def test_every_insert_writes_the_same_row() -> None:
    """The producer's INSERT of a generated id, the plain table's function (migration 0019) and
    the partitioned layout's write the same columns with the same values."""
    from outbox.store import QUERIES
    from outbox.store.partitions import layout

    new = _insert(QUERIES["insert_new_message"])
    assert new == _insert(_migration_0019())
    assert new == _insert(layout.PLAIN_INSERT)
    assert new == _insert(layout.PARTITIONED_INSERT)
