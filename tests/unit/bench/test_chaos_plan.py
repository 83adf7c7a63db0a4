"""The chaos campaign's plan says which rows of each message must end in the dead-letter topic:
all of a poison message, or the one bad row of a row-level kind (the rest written)."""

from __future__ import annotations

from bench.chaos_audit import _message_of
from bench.chaos_poison import GOOD, ROW_KINDS, Planned, poison_plan


def test_row_level_kinds_expect_one_row_dead_lettered_and_the_rest_written() -> None:
    plan = poison_plan("p", good=3, each=1, rows=5, seed=1)
    by_kind = {p.kind: p for p in plan}
    assert by_kind[GOOD].bad_rows == 0
    for kind in ROW_KINDS:
        assert by_kind[kind].bad_rows == 1
    assert by_kind["bad-encoding"].bad_rows == 5
    one_row = Planned(by_kind["reject-marker"].message, "c", 1, "reject-marker")
    assert one_row.bad_rows == 1  # the whole (one-row) message


def test_a_row_part_is_counted_for_its_message() -> None:
    part = {"rowbatch-chunk-id": "p:3~r0123456789ab", "rowbatch-parent-chunk-id": "p:3"}
    assert _message_of(part) == "p:3"
    assert _message_of({"rowbatch-chunk-id": "p:4"}) == "p:4"
