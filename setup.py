"""Only for the cffi extensions: everything else about the project is in pyproject.toml.

`pip install -e .` (run by `make setup`) compiles both:
- `native/_build.py:ffibuilder` into `native._uring` (our liburing bindings), and
- `native/_records_build.py:ffibuilder` into `native._records` (the broker's record-framing walk;
  no liburing, and optional: `ringlog_proto.batch` falls back to Python without it).
"""

from setuptools import setup

setup(cffi_modules=["native/_build.py:ffibuilder", "native/_records_build.py:ffibuilder"])
