"""What every folder shares: the config schema (``config``), the one-line usage error (``errors``),
typed records that save themselves as JSON (``record``) and atomic file writes (``atomic``)."""
