"""Sphinx configuration for instrumented_convs."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import instrumented_convs  # noqa: E402

project = "instrumented_convs"
author = "The instrumented_convs authors"
copyright = "2026, The instrumented_convs authors"
release = instrumented_convs.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
myst_heading_anchors = 3
html_theme = "alabaster"
nitpicky = False
