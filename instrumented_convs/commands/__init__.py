"""TODO: docstring."""
