"""Whether a listen address reaches beyond this machine, and what `broker serve` says about it.

`broker serve --host` with an address other machines can reach, and neither TLS nor SASL, would
hand every topic to anyone on the network: the CLI refuses it unless `--allow-plaintext` says the
operator means it (a private network, a test lab), and then warns at every start. A name is
resolved: every address it has must be a loopback one.

A wildcard address (0.0.0.0, ::) is where the broker listens, never where a client can connect:
without `--advertised-host` Metadata would send clients to it, so `broker serve` refuses it, as
Kafka refuses 0.0.0.0 in advertised.listeners.
"""

from __future__ import annotations

import ipaddress
import socket


def is_wildcard(host: str) -> bool:
    """True for the addresses that mean every interface: "", "*", 0.0.0.0, ::."""
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def exposure_warnings(host: str, tls: bool, sasl: bool, plain_in_clear: bool) -> list[str]:
    """What `broker serve` warns about at start on `host`: plaintext allowed where other machines
    reach it (only with --allow-plaintext: it is refused otherwise), and PLAIN's passwords
    crossing such a network in the clear (`plain_in_clear`: PLAIN offered without TLS)."""
    if is_loopback_only(host):
        return []
    out = []
    if not tls and not sasl:
        out.append(
            f"--allow-plaintext: serving {host or '*'}, which other machines can reach, in plaintext "
            "with no authentication: anyone who reaches it can read, write and delete every topic"
        )
    if plain_in_clear and not tls:
        out.append(
            f"--sasl-plain-without-tls on {host or '*'}, which other machines can reach: SASL/PLAIN "
            "passwords cross the network in the clear (use TLS, or SCRAM)"
        )
    return out


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
