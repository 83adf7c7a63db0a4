"""The JSON encoding (``application/json``) of a chunk: column-major, typed.

    {"columns": [
        {"name": "id",        "type": "int64",  "values": [1, 2, null]},
        {"name": "text",      "type": "string", "values": ["a", "", null]},
        {"name": "embedding", "type": "vector", "dim": 3,
         "values": [[0.1, 0.2, 0.3], null, [1, 2, 3]]}
    ]}

See ``docs/wire-format.md`` for the full rules. :mod:`~rowbatch.wire.codec_json.encode` writes it;
:mod:`~rowbatch.wire.codec_json.decode` reads the document and
:mod:`~rowbatch.wire.codec_json.values` its values, checking every value's JSON type against the
declared column type (a float in an int64 column, a bool in a float column, a string in a vector are
errors, never silent conversions).

Import a name from the module that defines it: this package re-exports nothing.
"""
