"""Who may connect and what they may do: the listener's exposure (plaintext beyond loopback is
refused by default, `exposure`), TLS (`tls`), credentials (`credentials`: SCRAM), authentication
(`sasl`, the state of each connection in `session`) and ACLs (`acls`; `watched`: the users and ACL
files the workers read, a copy of etcd's in a cluster). Below the request path (core, kafka) and
above storage: the handlers ask it, it never asks them. See docs/SECURITY.md."""
