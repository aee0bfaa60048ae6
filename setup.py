"""setup.py: metadata lives in setup.cfg; this adds the optional C fast path of steps.

``instrumented_convs/_speedups*.c`` need only CPython's headers (no torch). If they cannot be
built (no compiler), the install goes on and the package runs its Python twin
(``instrumented_convs/_stepbase.py``), which behaves the same, more slowly.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "instrumented_convs._speedups",
            [
                "instrumented_convs/_speedups.c",
                "instrumented_convs/_speedups_step.c",
                "instrumented_convs/_speedups_timed.c",
                "instrumented_convs/_speedups_anchor.c",
                "instrumented_convs/_speedups_count.c",
                "instrumented_convs/_speedups_hook.c",
            ],
            depends=["instrumented_convs/_speedups.h"],
            optional=True,
        ),
    ],
)
