"""Secrets never reach the log: ``rowbatch.consumer.service.logs.redact`` and the filter
``configure`` installs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from rowbatch.consumer.service import logs
from rowbatch.consumer.service.logs import MASK, RedactingFilter, redact

SECRET = "Sup3r-s3cret"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"postgresql://rowbatch:{SECRET}@127.0.0.1:5432/db",
            "postgresql://rowbatch:***@127.0.0.1:5432/db",
        ),
        (f"postgres://u:{SECRET}@h/db?sslmode=require", "postgres://u:***@h/db?sslmode=require"),
        (f"postgresql://u:{SECRET}@with@at@h/db", "postgresql://u:***@h/db"),
        (f"kafka://user:{SECRET}@b1:9092,b2:9092", "kafka://user:***@b1:9092,b2:9092"),
        (f"s3://AKIA:{SECRET}@bucket/x", "s3://AKIA:***@bucket/x"),
        (
            f"host=127.0.0.1 port=5432 user=u password={SECRET} dbname=d",
            "host=127.0.0.1 port=5432 user=u password=*** dbname=d",
        ),
        (f"password = '{SECRET} with spaces' dbname=d", "password = '***' dbname=d"),
        (f"postgresql://u@h/db?password={SECRET}&x=1", "postgresql://u@h/db?password=***&x=1"),
        (
            f"sasl_plain_password='{SECRET}', client_id='c'",
            "sasl_plain_password='***', client_id='c'",
        ),
        (f'{{"ssl_key_password": "{SECRET}"}}', '{"ssl_key_password": "***"}'),
        (f"PGPASSWORD={SECRET} psql", "PGPASSWORD=*** psql"),
        (f"client_secret: {SECRET}", "client_secret: ***"),
        (f"passwd={SECRET};next", "passwd=***;next"),
    ],
)
def test_redact_masks_credentials(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert SECRET not in redact(text)
    assert redact(redact(text)) == redact(text)


@pytest.mark.parametrize(
    "text",
    [
        'password authentication failed for user "rowbatch"',
        "postgresql://rowbatch@127.0.0.1:5432/rowbatch",
        "http://127.0.0.1:9464/metrics",
        "127.0.0.1:8001",
        "no password supplied",
        "cannot connect to PostgreSQL at 127.0.0.1:5432/db as rowbatch: refused",
        "model 'scorer': UNAVAILABLE: failed to connect to all addresses",
    ],
)
def test_redact_leaves_ordinary_text_alone(text: str) -> None:
    assert redact(text) == text


def fail(message: str) -> None:
    raise ConnectionError(message)


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("test.redaction")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield logger, stream, handler
    logger.removeHandler(handler)
    logger.propagate = True


def test_filter_masks_arguments_exceptions_stacks_and_extras(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = captured
    for formatter in (logs.JsonFormatter(), logging.Formatter("%(message)s %(dsn)s")):
        handler.setFormatter(formatter)
        dsn = f"postgresql://u:{SECRET}@h/db"
        try:
            fail(f"cannot connect: password={SECRET}")
        except ConnectionError:
            logger.exception("sink %s failed", dsn, extra={"dsn": dsn}, stack_info=True)
        logger.warning("config %r", {"sasl_plain_password": SECRET}, extra={"dsn": (dsn,)})
        logger.info("plain %s", "message", extra={"dsn": 5})
    out = stream.getvalue()
    assert SECRET not in out
    assert "postgresql://u:***@h/db" in out
    assert "password=***" in out
    assert f"'sasl_plain_password': '{MASK}'" in out
    assert "plain message" in out


def test_json_lines_stay_valid_json(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.JsonFormatter())
    logger.error('bad "dsn" host=h password=%s', SECRET, extra={"password": SECRET})
    record = json.loads(stream.getvalue())
    assert record["message"] == 'bad "dsn" host=h password=***'
    assert SECRET not in json.dumps(record)


def test_a_bad_format_string_is_still_logged_and_masked(
    captured: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.warning("dsn %s %s", f"password={SECRET}")  # noqa: PLE1206 - one argument short
    assert "dsn" in stream.getvalue()
    assert SECRET not in stream.getvalue()


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_configure_installs_the_filter(
    fmt: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    logs.configure(fmt, "INFO")
    logging.getLogger("rowbatch.consumer.sinks").error(
        "connect to postgresql://u:%s@h/db failed", SECRET
    )
    err = capsys.readouterr().err
    assert "postgresql://u:***@h/db" in err
    assert SECRET not in err
