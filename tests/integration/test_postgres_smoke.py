"""The PostgreSQL service is real: a round trip through psycopg, arrays included."""

from __future__ import annotations

import psycopg

from harness.postgres import PostgresEndpoint


def test_round_trip(postgres: PostgresEndpoint) -> None:
    with psycopg.connect(postgres.dsn) as conn:
        conn.execute(
            "CREATE TABLE smoke (id bigint PRIMARY KEY, name text NOT NULL, emb real[] NOT NULL)"
        )
        with conn.cursor() as cur, cur.copy("COPY smoke (id, name, emb) FROM STDIN") as copy:
            for i in range(1000):
                copy.write_row((i, f"row-{i} ✓", [float(i), 0.5]))
        conn.execute("INSERT INTO smoke VALUES (1, 'dup', '{0}') ON CONFLICT (id) DO NOTHING")
        count, name, emb = conn.execute(
            "SELECT count(*), max(name) FILTER (WHERE id = 1), max(emb) FILTER (WHERE id = 7)"
            " FROM smoke"
        ).fetchone() or (None, None, None)
        conn.rollback()
    assert count == 1000
    assert name == "row-1 ✓"
    assert emb == [7.0, 0.5]


def test_listens_on_loopback_only(postgres: PostgresEndpoint) -> None:
    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("SHOW listen_addresses").fetchone()
    assert row == ("127.0.0.1",)
