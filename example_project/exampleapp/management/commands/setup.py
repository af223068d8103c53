"""``manage.py setup``: migrate and create the admin user admin / admin, to click around."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

USERNAME = PASSWORD = "admin"


class Command(BaseCommand):
    help = "Migrate the example project's database and create the superuser admin / admin."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        self.stdout.write(f"Database: {settings.DATABASES['default']['NAME']} (migrated)")
        users = get_user_model().objects
        if not users.filter(username=USERNAME).exists():
            users.create_superuser(USERNAME, email="", password=PASSWORD)
        self.stdout.write(
            self.style.SUCCESS(f"Superuser: {USERNAME} / {PASSWORD}")
            + "\n\nNow, in two terminals:\n"
            "  python example_project/manage.py runserver\n"
            "  python example_project/manage.py ticker\n"
            "and open http://127.0.0.1:8000/admin/django_tasklock/cacheentry/ "
            "(and http://127.0.0.1:8000/slow/ to hold a lock from a request)."
        )
