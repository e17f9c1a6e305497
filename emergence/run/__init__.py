"""One run's bookkeeping around the recipe: config validation, the run record and its files
(``results``), the measurement cache, W&B tracking, sweep callbacks and prefetching, interrupts."""
