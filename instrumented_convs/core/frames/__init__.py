"""A step's frame: each thread's stack of open frames (stack), and one way to open and close
a frame for forward and backward steps alike (lifecycle)."""
