"""The ``[sink]`` settings: the result table's store (``kind``: SQLite, PostgreSQL, Parquet,
Iceberg) and
how writes are retried and grouped. The sinks package owns them; the service only assembles them
into the consumer's configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator

from rowbatch.consumer.section import Section
from rowbatch.timing import Backoff


class _SinkSection(Section):
    backoff_initial_s: float = Field(default=0.2, gt=0)
    """First wait after a transient sink failure (connection lost, database restarting,
    serialization failure, object-store throttling); doubles up to ``backoff_max_s``. Writes
    are retried for as long as the outage lasts, with consumption paused meanwhile."""
    backoff_max_s: float = Field(default=5.0, gt=0)
    startup_wait_s: float = Field(default=300.0, ge=0)
    """How long start-up waits for an unreachable sink (retrying with backoff) before giving
    up with an error."""
    on_row_error: Literal["dead-letter", "error-row"] = "dead-letter"
    """What becomes of a row that fails on its own (the model rejects it, its values fail the
    model's input checks): ``dead-letter``, to the dead-letter topic as a row part of its
    message; ``error-row``, written to the result table with null outputs and the columns
    ``error_reason``, ``error_code`` and ``error_message`` (null on the other rows), counted
    in ``rowbatch_rows_errored_total``. Rows the sink itself refuses are dead-lettered either
    way (docs/dead-letters.md)."""
    write_concurrency: int = Field(default=2, ge=1)
    """Sink writes at once. Answered batches queue for the writers (one write's worth per
    writer; inference waits for room when the sink is slower than the model) and are coalesced
    into one write."""
    max_write_rows: int = Field(default=0, ge=0)
    """Most rows coalesced into one sink write; 0: four target batches."""

    @model_validator(mode="after")
    def _backoff_order(self) -> _SinkSection:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError("sink.backoff_initial_s must not exceed sink.backoff_max_s")
        return self

    @property
    def backoff(self) -> Backoff:
        """The waits after a transient sink failure (writes and the start-up wait)."""
        return Backoff(self.backoff_initial_s, self.backoff_max_s, jitter=0.3)


class SqliteSinkSettings(_SinkSection):
    kind: Literal["sqlite"] = "sqlite"
    path: Path = Path("rowbatch-results.sqlite")
    table: str = "results"


class PostgresSinkSettings(_SinkSection):
    kind: Literal["postgres"] = "postgres"
    dsn: SecretStr
    table: str = "results"
    db_schema: str = "public"


class _RollsFiles(_SinkSection):
    target_file_mb: float = Field(default=128.0, gt=0)
    """Data files are rolled (and committed) at about this size."""
    commit_interval_s: float = Field(default=60.0, gt=0)
    """The sink's commit interval: longest wait between commits of the table (or dataset):
    rows are visible, and their messages acked, at most this long after they were written.
    Not Kafka's offset commit interval (``[source] commit_interval_s``)."""

    @property
    def target_file_bytes(self) -> int:
        return max(1, int(self.target_file_mb * 1024 * 1024))


class ParquetSinkSettings(_RollsFiles):
    """A Parquet dataset written in large files (one open file per day partition, published
    at each commit); one writer per dataset."""

    kind: Literal["parquet"] = "parquet"
    url: str
    """A local path or an object-store URL understood by pyarrow (``s3://``, ``gs://``)."""
    table: str = "results"


class IcebergSinkSettings(_RollsFiles):
    """An Apache Iceberg table in pyiceberg's SQL catalog (docs/iceberg.md): many replicas
    write it at once, each row exactly once, in large files."""

    kind: Literal["iceberg"] = "iceberg"
    catalog_uri: SecretStr
    """The catalog's database as a SQLAlchemy URL, e.g.
    ``postgresql+psycopg://user:password@host:5432/catalog``; the key ledger lives there too."""
    catalog_name: str = "rowbatch"
    warehouse: str
    """Where data and metadata files go: ``file:///path`` or ``s3://bucket/prefix``."""
    namespace: str = "rowbatch"
    table: str = "results"
    properties: dict[str, str] = Field(default_factory=dict)
    """More catalog and FileIO properties, as pyiceberg names them (``s3.endpoint``,
    ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.region``...)."""

    @model_validator(mode="after")
    def _check_uris(self) -> IcebergSinkSettings:
        scheme = urlsplit(self.catalog_uri.get_secret_value()).scheme
        if not scheme.startswith(("postgresql", "sqlite")):
            raise ValueError(
                "sink.catalog_uri must be a SQLAlchemy URL of PostgreSQL "
                "(postgresql+psycopg://...) or SQLite (sqlite:///path), "
                f"not scheme {scheme or '(none)'!r}"
            )
        if "://" not in self.warehouse:
            raise ValueError(
                "sink.warehouse must be a URL: file:///absolute/path or s3://bucket/prefix, "
                f"not {self.warehouse!r}"
            )
        return self
