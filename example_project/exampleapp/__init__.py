"""The example project of django-tasklock: settings, one task, and the ``demo`` command."""
