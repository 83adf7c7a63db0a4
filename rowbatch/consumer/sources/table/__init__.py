"""Offline table mode: a stored table (Parquet, CSV, JSON Lines; local or in an object store) read
once through the same engine as the brokers, resumable after a kill and split into shards.

One concern per module: ``settings`` (``TableSettings``, the ``[source]`` section), ``plan``
(the input's files and units, and a shard's share), ``reader`` (a unit's rows as pieces),
``encode`` (a piece as the chunk a producer would publish; rows that do not convert, bisected
out), ``state`` (the shard's state folder on a disk or an object store), ``checkpoint`` (the
settled ranges and the run's identity), ``dead_letters`` (the rows that could not be written,
with why) and ``source`` (``TableSource``, the ``Source`` protocol over all of it). Import a
name from the module that defines it: this package re-exports nothing."""
