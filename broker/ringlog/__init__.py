"""ringlog's own protocol over the core: its adapter (adapter.py), one module per API group, and
its SASL and ACL gate (access.py), the twin of broker/kafka/."""
