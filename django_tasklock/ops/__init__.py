"""What operators see: the held-locks display and the health findings.

Shared by the admin page, ``manage.py tasklock``, the system checks and the
django-health-check plugin, so that each says the same of a held lock.

May import: ``locking``, ``leases``, ``backends`` and the base modules. Never
``api`` (a sibling) or anything above.
"""
