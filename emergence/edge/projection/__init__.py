"""What of a checkpoint is kept per scope: its values (``exact``) or a random projection of them (``jl``)."""
