"""Whether a figure read periodically (a broker's lag) is current, and the log of its failed
reads: :class:`ReadStaleness`, the policy both Kafka sources' lag reports follow."""

from __future__ import annotations

import logging
from typing import Final

_LOG = logging.getLogger(__name__)

WARN_EVERY_S: Final = 60.0
"""A failing read is logged at once, then at most this often."""


class ReadStaleness:
    """Whether a figure read periodically is current, and the log of its failures: a warning
    at the first failure and then at most every ``warn_every_s`` (saying for how long), one
    when it turns stale (no successful read for ``stale_after_s``, counted from the last
    success, or from the first failure when none succeeded yet) and one when a read
    succeeds again. Used by both Kafka sources' lag reports."""

    def __init__(
        self,
        what: str,
        stale_after_s: float,
        *,
        withdrawn: str = "the figures",
        warn_every_s: float = WARN_EVERY_S,
        log: logging.Logger = _LOG,
    ) -> None:
        self._what = what
        self.stale_after_s = stale_after_s
        self._withdrawn = withdrawn
        self._warn_every_s = warn_every_s
        self._log = log
        self._last_read: float | None = None
        self._failing_since: float | None = None
        self._last_warned: float | None = None
        self.stale = False
        """No successful read for ``stale_after_s``: the figures are withdrawn (NaN)."""

    def succeeded(self, now: float) -> None:
        """A read succeeded at ``now`` (monotonic seconds)."""
        if self._failing_since is not None:
            self._log.warning(
                "%s read again after %.0f s of failures; %s are current again",
                self._what,
                now - self._failing_since,
                self._withdrawn,
            )
        self._last_read, self._failing_since, self._last_warned = now, None, None
        self.stale = False

    def failed(self, now: float, exc: BaseException) -> bool:
        """A read failed at ``now`` with ``exc``; True when the figures just turned stale (the
        caller withdraws them)."""
        if self._failing_since is None:
            self._failing_since = now
        since = self._last_read if self._last_read is not None else self._failing_since
        age = now - since
        became_stale = not self.stale and age >= self.stale_after_s
        self.stale = self.stale or became_stale
        due = self._last_warned is None or now - self._last_warned >= self._warn_every_s
        if became_stale or due:
            self._last_warned = now
            what = (
                f"{self._withdrawn} are NaN (not known) until a read succeeds"
                if self.stale
                else f"{self._withdrawn} are withdrawn after {self.stale_after_s:.0f} s"
            )
            self._log.warning(
                "could not read %s for %.0f s (%s: %s); %s",
                self._what,
                age,
                type(exc).__name__,
                exc,
                what,
            )
        return became_stale
