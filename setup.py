"""Only for the cffi extension: everything else about the project is in pyproject.toml.

`pip install -e .` (run by `make setup`) compiles `native/_build.py:ffibuilder` into `native._uring`.
"""

from setuptools import setup

setup(cffi_modules=["native/_build.py:ffibuilder"])
