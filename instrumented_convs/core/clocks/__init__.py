"""The clocks a step reads: the CPU clock (cpu), CUDA events pooled per device (events),
pairs of them resolved lazily (pending), and which of the two a step uses (choice)."""
