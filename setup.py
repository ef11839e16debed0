"""Only for the native extensions: everything else about the project is in pyproject.toml.

`pip install -e .` (run by `make setup`) compiles all six:
- `native/_build.py:ffibuilder` into `native._uring` (our liburing bindings), and
- `native/loop.c` into `native._loop` (the io_uring loop's per-completion step, in C against
  CPython's API and liburing: it calls the loop's Python continuations, which cffi cannot), and
- `native/frames.c` into `native._frames` (`ringlog_proto.frames.FrameDecoder`'s twin in C, which
  builds the `Frame`s itself; optional: `frame_decoder()` falls back to the Python one), and
- `native/batch.c` into `native._batch` (a whole batch of plain values in one CPython call, the
  producer's common case; optional: `ringlog_proto.batch` falls back to native._codec or Python), and
- `native/_records_build.py:ffibuilder` into `native._records` (the broker's record-framing walk;
  no liburing, and optional: `ringlog_proto.batch` falls back to Python without it), and
- `native/_codec_build.py:ffibuilder` into `native._codec` (the clients' v2 records-section codec;
  no liburing, and optional: `ringlog_proto.records_codec` falls back to Python without it).
"""

from setuptools import Extension, setup

setup(
    cffi_modules=[
        "native/_build.py:ffibuilder",
        "native/_records_build.py:ffibuilder",
        "native/_codec_build.py:ffibuilder",
    ],
    ext_modules=[
        Extension("native._loop", ["native/loop.c"], libraries=["uring"], extra_compile_args=["-O2"]),
        Extension("native._frames", ["native/frames.c"], extra_compile_args=["-O2"]),
        Extension("native._batch", ["native/batch.c"], extra_compile_args=["-O2"]),
    ],
)
