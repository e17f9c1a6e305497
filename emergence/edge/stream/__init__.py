"""The checkpoints read in order, once each, into the windows' spectra."""
