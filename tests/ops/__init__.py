"""What operators see: the admin page, manage.py tasklock, system checks, health, telemetry."""
