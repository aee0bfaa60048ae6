"""What a step does besides taking time, off unless switched on: FLOPs and bytes per op
(formulas, counters), memory kept and peaks (memory), and their figures added to a
snapshot (readings)."""
