"""ringlog's broker: storage engine, request handling, the per-core workers and their I/O loops.

Imports nothing, so that `broker.client` can be used without loading any server code.
"""

__version__ = "0.1.0"
