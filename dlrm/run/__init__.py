"""A run: where it writes (placement, locks), its records (config.yaml, continuations), logging, and
a finished run's rebuilt summary."""
