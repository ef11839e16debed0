"""Fixtures the security tests share."""

from __future__ import annotations

import pytest

from labkit.securitylab import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate and a client certificate, made for this module (trustme)."""
    return Pki.make(tmp_path_factory.mktemp("pki"))
