"""Launchers for the real services rowbatch runs against, on 127.0.0.1 with free ports.

Each launcher starts one native process (no Docker), waits for a real client call to succeed,
keeps the process log under the run directory and stops the process by its id. They are used
by the pytest fixtures in ``tests/conftest.py`` and by ``python -m harness up`` (the local
stack behind the README's main command).
"""

from harness.errors import PrerequisiteMissing, ServiceFailed

__all__ = ["PrerequisiteMissing", "ServiceFailed"]
