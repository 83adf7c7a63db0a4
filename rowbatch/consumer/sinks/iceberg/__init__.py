"""The Iceberg sink: result rows in an Apache Iceberg table that many consumer replicas write at
once, exactly once, in large files (docs/iceberg.md).

- **Large files.** Rows are streamed into one open Parquet data file per day partition (a row
  group of ~4 MiB at a time, never a whole file in memory), rolled at ``target_file_mb``; every
  ``commit_interval_s`` (or sooner: the file is full, or the messages waiting for a commit hold
  half the memory budget) the files are committed in one snapshot (a fast append). The pipeline
  acks a message only after the commit that holds its last row
  (:mod:`rowbatch.consumer.engine.commit_stage`); until then the broker keeps it leased.
- **Exactly once, no local state.** The catalog is pyiceberg's SQL catalog; the key ledger
  (:mod:`.ledger`: which row ranges of which chunk each commit holds) lives in the catalog's
  database and is written in the same transaction that swaps the table's metadata pointer
  (:mod:`.catalog`), under the row lock that swap takes. A commit holding a row another commit
  already holds (a redelivery after a crash between the commit and the ack; a message handed to
  another replica while this one still held it) rolls back whole; its files are written again
  without those rows and committed. A commit whose outcome is unknown is looked up by its id
  before anything is retried. Writes ask the ledger first, so a redelivered message usually
  writes nothing at all.
- **Dead letters.** A dead-lettered message's rows are dropped from the files not yet committed;
  rows of it already committed (a message whose rows spanned two commits) are deleted from the
  table in a commit that also releases their ledger rows.
"""
