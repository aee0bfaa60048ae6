"""A generic layer's own statements and the functions its forward calls, as steps: without them
that work would be the layer's own time, in no named step. The functions are routed through
steps while a layer runs (:mod:`.routes`); the statements of work get steps, split where
they also call steps, in a forward rebuilt from the installed source (:mod:`.forward`).
"""
