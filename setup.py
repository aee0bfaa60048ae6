"""setup.py: metadata lives in setup.cfg; this adds the optional C fast path of steps.

``instrumented_convs/_speedups.c`` needs only CPython's headers (no torch). If it cannot be
built (no compiler), the install goes on and the package runs its Python twin
(``instrumented_convs/_stepbase.py``), which behaves the same, more slowly.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("instrumented_convs._speedups", ["instrumented_convs/_speedups.c"], optional=True),
    ],
)
