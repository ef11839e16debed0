"""ringlog_proto: the sans-I/O half of ringlog.

This package contains no networking and no file code (the h11 rule): the record batch format, and,
as the protocol grows, the frame codec, messages, error codes and the reference rendezvous hash.
Clients, the broker and the Spark source all depend on it; it depends on nothing of theirs.
"""

from ringlog_proto.batch import (
    BatchError,
    BatchHeader,
    Record,
    decode_batches,
    decode_records,
    encode_batch,
    invalid_batch,
    iter_batches,
    read_header,
    set_base_offset,
)

__all__ = [
    "BatchError",
    "BatchHeader",
    "Record",
    "decode_batches",
    "decode_records",
    "encode_batch",
    "invalid_batch",
    "iter_batches",
    "read_header",
    "set_base_offset",
]
