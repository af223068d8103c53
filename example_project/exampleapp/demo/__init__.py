"""The two scenarios of ``manage.py demo``, each with its parent and worker side."""
