"""Fixtures shared by the native bindings' tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe's (read end, write end), closed after the test."""
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)
