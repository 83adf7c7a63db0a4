"""What the consumer reports about itself: Prometheus metrics and the autoscaling signal
(lag, throughput, desired replicas). Used by the engine and the sources, so it imports
neither."""
