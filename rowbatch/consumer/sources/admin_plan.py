"""What ``rowbatch-consumer admin ensure`` finds on a broker and what it does about it: one step
per topic or subscription (create it, or it exists and matches, or it exists and differs, with
each differing field named), shared by the Kafka and Pub/Sub admin modules."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rowbatch.consumer.sources.base import SourceError, SourceUnreachable


class Outcome(StrEnum):
    CREATE = "create"
    """Absent: ``admin ensure`` creates it (a dry run only says so)."""
    OK = "ok"
    """Present, and every compared field is what the config wants."""
    DIFFERS = "differs"
    """Present, with at least one field not what the config wants; never changed."""


@dataclass(frozen=True)
class Difference:
    """One field of an existing resource that is not what the config wants."""

    field: str
    want: str
    have: str

    def __str__(self) -> str:
        return f"{self.field} is {self.have}, the config wants {self.want}"


def compare(field: str, want: object, have: object) -> Difference | None:
    """A ``Difference`` when ``have`` is not ``want`` (values shown as ``str``; None as
    ``none``); None when they agree."""
    if want == have:
        return None
    return Difference(field, _show(want), _show(have))


def _show(value: object) -> str:
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class Step:
    """One resource: what kind it is, its name, and what ``admin ensure`` does about it."""

    kind: str
    """``topic``, ``subscription``, ``dead-letter topic``..."""
    name: str
    outcome: Outcome
    settings: str = ""
    """What the config wants of it, in words (printed for creations)."""
    differences: tuple[Difference, ...] = ()

    def describe(self) -> str:
        head = f"{self.kind} {self.name}"
        if self.outcome is Outcome.CREATE:
            return f"create   {head}" + (f" ({self.settings})" if self.settings else "")
        if self.outcome is Outcome.OK:
            return f"ok       {head}"
        return f"DIFFERS  {head}: " + "; ".join(str(d) for d in self.differences)


def step(kind: str, name: str, settings: str, differences: list[Difference | None]) -> Step:
    """An existing resource's step: OK, or DIFFERS with the differences that are not None."""
    found = tuple(d for d in differences if d is not None)
    outcome = Outcome.DIFFERS if found else Outcome.OK
    return Step(kind, name, outcome, settings, found)


@dataclass(frozen=True)
class Plan:
    """Every resource one consumer configuration needs on one broker, in creation order."""

    broker: str
    """What was asked, in words: ``Pub/Sub at HOST`` or ``Kafka at BOOTSTRAP``."""
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    """Things the operator should know that are not differences (printed after the steps)."""

    @property
    def to_create(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.outcome is Outcome.CREATE)

    @property
    def differing(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.outcome is Outcome.DIFFERS)

    def lines(self) -> list[str]:
        return [
            f"{self.broker}:",
            *(f"  {s.describe()}" for s in self.steps),
            *(f"  note: {n}" for n in self.notes),
        ]


class AdminUnreachable(SourceUnreachable):
    """The broker did not answer; the message names its address."""


class AdminFailed(SourceError):
    """The broker refused a lookup or a creation (permissions, an impossible replication
    factor...); the message names the resource and the broker's reason."""
