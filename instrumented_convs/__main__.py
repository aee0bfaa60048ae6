"""``python -m instrumented_convs demo|compare|bench``: see :mod:`instrumented_convs.study.cli`."""

import sys

from .study.cli import main

if __name__ == "__main__":
    sys.exit(main())
