"""Who may connect and what they may do: the listener's exposure (plaintext beyond loopback is
refused by default), and, as issue 14 lands them, credentials (SCRAM), authentication (SASL) and
ACLs. Below the request path (core, kafka) and above storage: the handlers ask it, it never asks
them. See docs/SECURITY.md."""
