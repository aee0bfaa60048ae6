"""setup.py: metadata lives in setup.cfg; this adds the optional C fast path of steps.

``instrumented_convs/core/native/_speedups*.c`` need only CPython's headers (no torch). If they
cannot be built (no compiler), the install goes on and the package runs its Python twin
(``instrumented_convs/core/steps/stepbase.py``), which behaves the same, more slowly.
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "instrumented_convs.core.native._speedups",
            [
                "instrumented_convs/core/native/_speedups.c",
                "instrumented_convs/core/native/_speedups_step.c",
                "instrumented_convs/core/native/_speedups_timed.c",
                "instrumented_convs/core/native/_speedups_anchor.c",
                "instrumented_convs/core/native/_speedups_count.c",
                "instrumented_convs/core/native/_speedups_hook.c",
                "instrumented_convs/core/native/_speedups_cuda.c",
            ],
            depends=["instrumented_convs/core/native/_speedups.h"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
            optional=True,
        ),
    ],
)
