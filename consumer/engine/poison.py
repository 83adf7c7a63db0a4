"""Finding the groups (the rows of one message, inside a batch) that make a request fail, by
bisecting: try the whole, split what fails in halves, until every failing piece is one group.

With ``k`` poison groups among ``n``, this takes at most ``1 + 2 * k * ceil(log2 n)`` attempts
(one, when nothing fails), plus ``k`` with ``confirm``, and every good group is answered as part
of some successful attempt, so no result is computed twice.

``confirm``: a group is called poison only after a further attempt of its own fails too. A
server that merges concurrent *requests* into one execution (MLServer's adaptive batching)
fails every request merged with a bad one, so a good message bisected down to itself, or the
only message of a batch, may have failed for another request's sake; the caller should also
keep isolation attempts from running concurrently with each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

G = TypeVar("G")
R = TypeVar("R")


@dataclass
class Isolation(Generic[G, R]):
    """What :func:`isolate` found, in the order of the input groups."""

    good: list[tuple[list[G], R]] = field(default_factory=list)
    """Runs of consecutive groups that succeeded together, with the attempt's result."""
    bad: list[tuple[G, BaseException]] = field(default_factory=list)
    """Single groups that fail alone, with the poison error they caused."""


async def isolate(
    groups: Sequence[G],
    attempt: Callable[[Sequence[G]], Awaitable[R]],
    is_poison: Callable[[BaseException], bool],
    *,
    known_failure: BaseException | None = None,
    confirm: bool = False,
) -> Isolation[G, R]:
    """Runs ``attempt`` on ``groups`` and, where it raises an error that ``is_poison``, on each
    half, recursively, one attempt at a time. Any other error propagates at once (a transient
    error should be retried inside ``attempt``, not bisected).

    ``known_failure``: the poison error the caller already got for all of ``groups``, which
    saves repeating that first attempt. ``confirm``: see the module's docstring.
    """
    found: Isolation[G, R] = Isolation()

    async def split(part: Sequence[G], failure: BaseException, *, alone: bool = False) -> None:
        if len(part) == 1:
            if confirm and not alone:
                await run(part, alone=True)
            else:
                found.bad.append((part[0], failure))
            return
        middle = len(part) // 2
        await run(part[:middle])
        await run(part[middle:])

    async def run(part: Sequence[G], *, alone: bool = False) -> None:
        try:
            result = await attempt(part)
        except Exception as exc:
            if not is_poison(exc):
                raise
            failure = exc
        else:
            found.good.append((list(part), result))
            return
        # Outside the handler, so later errors do not chain onto this one.
        await split(part, failure, alone=alone)

    if groups:
        if known_failure is None:
            await run(groups)
        else:
            await split(groups, known_failure)
    return found
