"""``python -m emergence.edge``: spectral edge dynamics of a checkpoint series in parameter space
(Xu 2026, arXiv 2603.15678; docs/edge.md). One folder per concept:

* ``scopes``: which parameters each scope covers (the model, a decoder block, a head);
* ``projection``: a checkpoint as one vector per scope, exact or a streamed random projection;
* ``series``: the windows of a series, and the series refused;
* ``stream``: the checkpoints read once each, in order, into windows;
* ``output``: ``edge.png``;
* ``command``: the command line's glue.

One window's spectrum (pure maths) and ``edge.json``'s records are ``emergence/recipe/edge.py``: the
panel report reads them too (F6).
"""
