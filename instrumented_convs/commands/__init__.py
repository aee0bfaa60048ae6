"""The commands of ``python -m instrumented_convs`` (one parser: :mod:`.cli`).

- :mod:`.launch`: ``run`` (profile a script nobody changed), ``view``, ``merge``, ``diff``;
- :mod:`.check`: ``check``, the library's claims checked on this machine;
- :mod:`.study`: ``demo``, ``compare``, ``bench`` (the profiling study) and the examples'
  command lines.

They use the public face (``instrumented_convs``), the public modules and each part's API
(``instrumented_convs.report``, ``instrumented_convs.core``), never a module inside another
part (``tests/test_layering.py``).
"""
