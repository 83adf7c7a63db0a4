"""The Google Cloud Pub/Sub source: unary pull (the default) or streaming pull, with lease
extension and dead letters published with their reason."""
