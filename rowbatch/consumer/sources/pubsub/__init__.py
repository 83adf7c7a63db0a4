"""The Google Cloud Pub/Sub source: unary pull (the default, ``pull.PubSubPullSource``) or
streaming pull (``streaming.PubSubSource``), with lease extension and dead letters published
with their reason; both take ``settings.PubSubSettings``. Import a name from the module that
defines it: this package re-exports nothing, so importing the settings costs no client
library."""
