"""What the edge draws: ``edge.png`` (its records, ``edge.json``, are ``recipe/edge.py``'s)."""
