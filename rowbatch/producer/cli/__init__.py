"""``python -m rowbatch.producer`` (``rowbatch-producer``): publish a file of rows to Pub/Sub or
Kafka, or generate load. One module per subcommand (``publish``, ``loadgen``); ``parser`` builds the
command line and ``main`` runs it.

    python -m rowbatch.producer publish --broker kafka --bootstrap localhost:9092 --topic rows \\
        --file orders.csv --chunk-rows 1000 --encoding arrow --table orders
    python -m rowbatch.producer publish --broker pubsub --project my-proj --topic rows \\
        --file - --format jsonl --table orders < orders.jsonl
    python -m rowbatch.producer loadgen --broker kafka --bootstrap localhost:9092 --topic rows \\
        --rows 100000 --rate max --kind text --malformed 0.02 --manifest sent.json

Progress goes to stderr (a bar on a terminal: rows, rows/s, ETA); the summary line (rows,
chunks, bytes, seconds, rows/s) to stdout. Errors are one line on stderr naming the file/row/
column/topic; the exit status is 1 (2 for a bad command line or set-up, e.g. no Google
credentials for Pub/Sub).

Chunk ids are ``<id prefix>:<chunk number>`` (``.<part>`` appended when a chunk is split). For
a file the default prefix is derived from the file (path, size, modification time) and the
settings that decide the cut, so publishing the same file again with the same settings re-sends
the same ids and the consumer writes each row once; ``--id-prefix`` sets it.

Import a name from the module that defines it: this package re-exports nothing.
"""
