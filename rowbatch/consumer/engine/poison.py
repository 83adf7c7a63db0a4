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

``is_fatal``: errors that are not about the rows as far as the server says (MLServer and
KServe answer INTERNAL for any exception a model raises, on whichever rows), bisected like
poison so that one crashing group does not fail its batch-mates; the single groups that still
fail so are reported in :attr:`Isolation.failed`, for the caller to retry later rather than
condemn (the server itself may be at fault). Bisecting is the wrong answer to a server that
fails *everything*, so the cost is bounded: until some attempt of the isolation succeeds, at
most ``1 + ceil(log2 n)`` attempts may fail fatally; the next fatal failure ends the isolation
and every group not yet answered goes to :attr:`Isolation.failed` too. A server failing every
request thus costs ``2 + ceil(log2 n)`` attempts per isolation (6 for 10 groups, 9 for 100),
not the ``2n - 1`` of a full bisection. The allowance is the depth of the bisection plus one,
which is exactly what a single fatal group needs: depth first, the attempts that fail before
the first success are those on the path from the whole down to the group while it keeps to
the left halves (the first right turn means its left sibling succeeded), at most ``1 +
ceil(log2 n)`` of them. So one fatal group among ``n`` is always found with every other group
answered (within ``1 + 2 * ceil(log2 n)`` attempts, plus one with ``confirm``), and so are
several unless those failures come first, all down the left; once anything succeeded, the
server works for some rows, and bisecting goes on as for poison. Before that first success,
``confirm`` does not re-try a group failing fatally (the failure may be the server's, and the
group is only handed back, not condemned).
"""

from __future__ import annotations

import math
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
    failed: list[tuple[G, BaseException]] = field(default_factory=list)
    """Groups to try again later, with the fatal error: single groups that fail alone so, and
    the groups left untried when the isolation stopped (see the module's docstring)."""


def _never(exc: BaseException) -> bool:
    return False


async def isolate(
    groups: Sequence[G],
    attempt: Callable[[Sequence[G]], Awaitable[R]],
    is_poison: Callable[[BaseException], bool],
    *,
    is_fatal: Callable[[BaseException], bool] = _never,
    known_failure: BaseException | None = None,
    confirm: bool = False,
) -> Isolation[G, R]:
    """Runs ``attempt`` on ``groups`` and, where it raises an error that ``is_poison`` (or
    ``is_fatal``), on each half, recursively, one attempt at a time. Any other error propagates
    at once (a transient error should be retried inside ``attempt``, not bisected).

    ``known_failure``: the poison (or fatal) error the caller already got for all of
    ``groups``, which saves repeating that first attempt. ``confirm``, ``is_fatal``: see the
    module's docstring.
    """
    found: Isolation[G, R] = Isolation()
    allowance = 1 + math.ceil(math.log2(len(groups))) if groups else 0
    fatal_failures = 0
    stopped: BaseException | None = None

    async def split(part: Sequence[G], failure: BaseException, *, alone: bool = False) -> None:
        if len(part) == 1:
            retry = confirm and not alone and (is_poison(failure) or bool(found.good))
            if retry:
                await run(part, alone=True)
            elif is_poison(failure):
                found.bad.append((part[0], failure))
            else:
                found.failed.append((part[0], failure))
            return
        middle = len(part) // 2
        await run(part[:middle])
        await run(part[middle:])

    async def run(part: Sequence[G], *, alone: bool = False) -> None:
        if stopped is not None:
            found.failed.extend((group, stopped) for group in part)
            return
        try:
            result = await attempt(part)
        except Exception as exc:
            if not is_poison(exc) and not is_fatal(exc):
                raise
            failure = exc
        else:
            found.good.append((list(part), result))
            return
        # Outside the handler, so later errors do not chain onto this one.
        await settle(part, failure, alone=alone)

    async def settle(part: Sequence[G], failure: BaseException, *, alone: bool = False) -> None:
        nonlocal fatal_failures, stopped
        if not is_poison(failure) and not found.good:
            fatal_failures += 1
            if fatal_failures > allowance:
                stopped = failure
                found.failed.extend((group, failure) for group in part)
                return
        await split(part, failure, alone=alone)

    if groups:
        if known_failure is None:
            await run(groups)
        else:
            await settle(groups, known_failure)
    return found
