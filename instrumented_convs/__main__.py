"""``python -m instrumented_convs COMMAND``: see :mod:`instrumented_convs.commands.cli`."""

import sys

from .commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
