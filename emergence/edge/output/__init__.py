"""What the edge writes: ``edge.json`` (typed records that save themselves) and ``edge.png``."""
