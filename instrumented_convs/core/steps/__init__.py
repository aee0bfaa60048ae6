"""The step API (step, region, mark_outputs, recording) and the common case of its enter and
exit, the Python twin of the C fast path (stepbase)."""
