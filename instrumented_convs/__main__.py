"""``python -m instrumented_convs COMMAND``: see :mod:`instrumented_convs.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
