"""ringlog's own protocol over the core: its handlers (adapter.py) and its SASL and ACL gate
(access.py), the twin of broker/kafka/."""
