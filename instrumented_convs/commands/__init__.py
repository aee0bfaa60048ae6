"""The commands of ``python -m instrumented_convs`` (one parser: :mod:`.cli`): ``run``,
``view``, ``merge``, ``diff`` (:mod:`.launch`), ``check`` (:mod:`.check`), ``demo``,
``compare``, ``bench`` (:mod:`.study`). They use the public face and each part's API, never
a module inside another part.
"""
