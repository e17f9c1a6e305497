"""Which checkpoints make which windows, and the checks that refuse a broken series."""
