"""A table run's dead letters (the ``dead-letters-*`` JSON lines in each shard's state folder)
as a ``DeadLetterQueue`` for ``stats`` and ``show``: one letter per row (or per unreadable part
of a file), with its key ``<shard folder>/<file>#<file row>``, reason, code, message and values.
Replaying them is not a broker publish: a table run is rerun over its input instead (the rows
it dead-lettered are settled, so a rerun skips them; ``--new-run`` starts over), so ``publish``
and ``remove`` refuse, naming that."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, Final

import orjson

from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.consumer.dlq.queue import DeadLetterQueueError
from rowbatch.consumer.sources.table.dead_letters import read_dead_letters
from rowbatch.consumer.sources.table.settings import TableSettings
from rowbatch.consumer.sources.table.state import StateFolder
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
)
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_ROW_COUNT, H_TABLE

SHARD_FOLDER: Final = re.compile(r"shard-[0-9]+-of-[0-9]+")


class TableDeadLetterQueue:
    """The dead letters of every shard of a table run under ``[source] state``."""

    def __init__(self, settings: TableSettings) -> None:
        self._settings = settings

    @property
    def where(self) -> str:
        return f"table run state {self._settings.state}"

    @property
    def default_target(self) -> str:
        return self._settings.input

    async def letters(self) -> AsyncIterator[DeadLetter]:
        for shard, records in await asyncio.to_thread(self._read):
            for record in records:
                yield _letter(shard, record, self._settings.table)

    def _read(self) -> list[tuple[str, list[dict[str, Any]]]]:
        try:
            root = StateFolder(self._settings.state, "")
            shards = sorted(
                info.base_name
                for info in root.fs.get_file_info(_selector(root.path))
                if SHARD_FOLDER.fullmatch(info.base_name)
            )
            return [
                (name, read_dead_letters(StateFolder(self._settings.state, name)))
                for name in shards
            ]
        except (OSError, ValueError) as exc:
            raise DeadLetterQueueError(f"cannot read {self.where}: {exc}") from exc

    async def publish(self, letter: DeadLetter, topic: str) -> str:
        raise DeadLetterQueueError(
            "a table run's dead letters are not replayed by publishing: mend the cause and run "
            "the table again with --new-run (the rows it dead-lettered count as settled, so a "
            "plain rerun skips them)"
        )

    async def remove(self, letter: DeadLetter, replayed_as: str) -> None:
        raise DeadLetterQueueError("a table run's dead letters stay in its state folder")

    async def close(self) -> None:
        return None


def _selector(path: str) -> Any:
    import pyarrow.fs as pafs  # noqa: PLC0415

    return pafs.FileSelector(path, allow_not_found=True)


def _moment(value: object) -> datetime | None:
    """A record's ``at``; None (shown as unknown) when it is not a time."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _is_row(record: dict[str, Any]) -> bool:
    """One row's record (its values, possibly of no column), not an unreadable part."""
    return isinstance(record.get("row"), dict)


def _letter(shard: str, record: dict[str, Any], table: str) -> DeadLetter:
    rows = record.get("rows")
    attributes = {
        ATTR_REASON: str(record.get("reason") or ""),
        ATTR_CODE: str(record.get("code") or ""),
        ATTR_MESSAGE: str(record.get("message") or ""),
        ATTR_SOURCE: f"{shard}/{record.get('file')}",
        ATTR_DELIVERY_ATTEMPT: str(record.get("attempt") or ""),
        ATTR_TIME: str(record.get("at") or ""),
        H_TABLE: table,
        H_CHUNK_ID: str(record.get("chunk_id") or ""),
        # a row's record is one row; an unreadable part of a file says how many, if known
        H_ROW_COUNT: str(rows) if rows is not None else ("1" if _is_row(record) else ""),
    }
    return DeadLetter(
        ref=f"{shard}/{record.get('file')}#{record.get('file_row')}",
        payload=orjson.dumps(record.get("row")),
        attributes={k: v for k, v in attributes.items() if v},
        queued_at=_moment(record.get("at")),
        values=record.get("row") or {},
    )


__all__ = ["TableDeadLetterQueue"]
