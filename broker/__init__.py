"""ringlog's broker: storage engine, request handling, the per-core workers and their I/O loops."""
