"""The README and the docs are true: their commands, their figures, the example project."""
