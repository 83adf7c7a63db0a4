"""A benchmark run stopped by SIGTERM (or SIGINT, even when a background shell ignored it)
leaves through its ``with`` blocks, which stop every service it started."""

from __future__ import annotations

import os
import signal

import pytest

from bench.run_start import stop_cleanly_on_signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_unwinds_the_run(signum: int) -> None:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` in a script leaves it
    unwound = []
    try:
        stop_cleanly_on_signals()
        with pytest.raises((SystemExit, KeyboardInterrupt)):
            try:
                os.kill(os.getpid(), signum)
                signal.sigtimedwait([], 0)  # let the handler run
            finally:
                unwound.append(True)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert unwound == [True]
