"""Where results go: one adapter per table store behind the ``Sink`` protocol."""
