"""Only for the cffi extensions: everything else about the project is in pyproject.toml.

`pip install -e .` (run by `make setup`) compiles all three:
- `native/_build.py:ffibuilder` into `native._uring` (our liburing bindings), and
- `native/_records_build.py:ffibuilder` into `native._records` (the broker's record-framing walk;
  no liburing, and optional: `ringlog_proto.batch` falls back to Python without it), and
- `native/_codec_build.py:ffibuilder` into `native._codec` (the clients' v2 records-section codec;
  no liburing, and optional: `ringlog_proto.records_codec` falls back to Python without it).
"""

from setuptools import setup

setup(
    cffi_modules=[
        "native/_build.py:ffibuilder",
        "native/_records_build.py:ffibuilder",
        "native/_codec_build.py:ffibuilder",
    ]
)
