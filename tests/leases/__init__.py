"""A held lease: deadlines, the heartbeat's batches and ticks, where signals run, tokens."""
