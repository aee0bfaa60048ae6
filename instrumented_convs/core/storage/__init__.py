"""Where steps' times are kept: an entry per step path (entry), their tree (registry), and
when each call ran (timeline)."""
