"""Each task framework and scheduler with real worker processes."""
