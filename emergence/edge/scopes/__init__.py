"""Which parameters (and which parts of them) each scope of the edge covers."""
