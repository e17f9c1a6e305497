"""The maths of one window: its Gram matrix's spectrum and the ratios read from it (pure numpy)."""
