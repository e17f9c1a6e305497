"""The learning coefficient's command: ``python -m emergence.llc.calibrate`` (the measure itself is
``emergence/measures/llc.py``; docs/llc.md)."""
