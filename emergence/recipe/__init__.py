"""The per-checkpoint recipe and its maths: probe batches, the one capture pass, the screen,
spectral estimators, statistics, sinks, the mechanism, ablation and its verdict. Pure functions on
tensors and typed records; nothing here knows the Hub, the run directory or the panel."""
