"""`python -m broker.cli`: the `broker` command."""

import sys

from broker.cli import main

if __name__ == "__main__":
    sys.exit(main())
