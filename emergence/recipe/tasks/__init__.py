"""The reference study's four task batches (IOI, greater-than, successor, variable binding) and
their matched-random controls."""
