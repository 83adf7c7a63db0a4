"""Where messages come from: one adapter per broker behind the ``Source`` protocol."""
