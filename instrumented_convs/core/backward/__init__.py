"""A step's backward: which forward call's backward is timed (sampling), the autograd
nodes a step created (anchor), and the hooks that open and close backward frames (hooks)."""
