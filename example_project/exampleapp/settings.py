"""Settings of the example project: SQLite next to this package, no other services.

The lock backend is not set here, so the ``TASKLOCK_BACKEND`` environment
variable chooses it ("database" when unset): ``TASKLOCK_BACKEND=redis`` alone
switches to the Redis at ``redis://127.0.0.1:6379/0`` (another one with the
``TASKLOCK_REDIS_URL`` environment variable; needs ``pip install -e '.[redis]'``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/

SECRET_KEY = "example-project-only-not-a-secret"  # never deployed
DEBUG = True
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "exampleapp.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasklock",
    "exampleapp",
]

DATABASES: dict[str, Any] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        # A file, not :memory:, so that the demo's worker processes share it.
        "NAME": BASE_DIR / "db.sqlite3",
    },
}

# Used only when the Redis backend is chosen.
TASKLOCK_REDIS_URL = os.environ.get("TASKLOCK_REDIS_URL") or "redis://127.0.0.1:6379/0"

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # Times to the millisecond and the pid: the demo's processes share one console.
        "worker": {
            "format": "    %(asctime)s.%(msecs)03d [pid %(process)d] %(message)s",
            "datefmt": "%H:%M:%S",
        },
        "library": {
            "format": "    %(asctime)s.%(msecs)03d [pid %(process)d] %(levelname)s "
            "%(name)s: %(message)s",
            "datefmt": "%H:%M:%S",
        },
    },
    "handlers": {
        "worker": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
            "formatter": "worker",
        },
        "library": {"class": "logging.StreamHandler", "formatter": "library"},
    },
    "loggers": {
        "exampleapp": {"handlers": ["worker"], "level": "INFO", "propagate": False},
        "django_tasklock": {"handlers": ["library"], "level": "WARNING", "propagate": False},
    },
}
