"""The model side: discovering a model's tensor spec from the inference server, binding
table columns to its inputs, building tensors, and the gRPC inference client with its
retries, backoff and TLS."""
