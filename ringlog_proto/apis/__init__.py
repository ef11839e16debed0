"""The request and response types of every API, one module per API group, and what they are
written in: the wire's numbers (`codes`) and a body's primitives and base types (`body`).

Each type's `write` and `read` are its body layout; framing a type (`encode_request`,
`decode_response`...) and the tables from api key to type are in ringlog_proto/messages.py, which
re-exports every name here: code reaches them as `m.X` (`from ringlog_proto import messages as m`).
"""
