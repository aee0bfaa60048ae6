"""torch.compile: whether Dynamo is tracing (dynamo), graph breaks blamed on a layer's line
(breaks), and recorded iterations run eagerly beside compiled ones (eager)."""
