"""The spectral edge of a checkpoint series in parameter space (Xu 2026, arXiv 2603.15678; docs/edge.md):
how the weights' updates move, per scope and window. Read top to bottom:

* ``spectrum``: one window's spectrum from its Gram matrix (the maths);
* ``records``: ``edge.json``'s records (the panel report's F6 reads them);
* ``scopes``: the scopes (model, embeddings, layers and their groups, heads) and the cells they sum;
* ``series``: which windows a series has, and the series refused;
* ``tensor_files``: safetensors tensors read by offset, a block at a time;
* ``exact``: the exact band Gram matrices, streamed block by block;
* ``stream``: a series read into them: on disk once, or as a band of downloads;
* ``sketch``: a count sketch per scope, for a model while it trains; ``live``: its windows;
* ``windows``: every window's spectrum from the band; ``figure``: ``edge.png``.

``python -m emergence.edge`` (``emergence/edge.py``) is the command.
"""
