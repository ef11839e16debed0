"""Whether a listen address reaches beyond this machine.

`broker serve --host` with an address other machines can reach, and neither TLS nor SASL, would
hand every topic to anyone on the network: the CLI refuses it unless `--allow-plaintext` says the
operator means it (a private network, a test lab). A name is resolved: every address it has must
be a loopback one.
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback_only(host: str) -> bool:
    """True when every address `host` names (or resolves to) is a loopback address. The empty
    name and the wildcards (0.0.0.0, ::) listen on every interface, so they are not."""
    if host in ("", "*"):
        return False
    try:
        addresses = {ipaddress.ip_address(host)}
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return False  # unresolvable: the listener will fail anyway; do not call it safe
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}
    return bool(addresses) and all(a.is_loopback for a in addresses)
