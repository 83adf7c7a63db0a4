"""What the PostgreSQL sink reads from its DSN: the password (to blank it out of messages) and
``host:port/dbname`` (to name the database in messages without the DSN)."""

from __future__ import annotations

import contextlib

import psycopg
from psycopg.conninfo import conninfo_to_dict


def password(dsn: str) -> str:
    """The DSN's password, or ``""`` when it has none (or cannot be parsed)."""
    with contextlib.suppress(psycopg.ProgrammingError):
        return str(conninfo_to_dict(dsn).get("password") or "")
    return ""


def describe(dsn: str) -> str:
    """``host:port/dbname`` for messages (never the password)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    host = info.get("host") or info.get("hostaddr") or "localhost"
    return f"{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"
