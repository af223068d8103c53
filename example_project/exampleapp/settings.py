"""Settings of the example project: SQLite next to this package, no other services.

The lock backend is not set here, so the ``TASKLOCK_BACKEND`` environment
variable chooses it ("database" when unset): ``TASKLOCK_BACKEND=redis`` alone
switches to the Redis at ``redis://127.0.0.1:6379/0`` (another one with the
``TASKLOCK_REDIS_URL`` environment variable; needs ``pip install -e '.[redis]'``).
``DATABASE_URL=postgres://user:password@host:5432/name`` puts the database (and
so the database backend's locks) in PostgreSQL instead of SQLite (needs
``pip install -e '.[postgres]'``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/

SECRET_KEY = "example-project-only-not-a-secret"  # never deployed
DEBUG = True
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "exampleapp.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_tasklock",
    "exampleapp",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"


def _database(url: str | None) -> dict[str, Any]:
    if not url:
        # A file, not :memory:, so that the demo's worker processes share it.
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, got {parts.scheme}://")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES: dict[str, Any] = {"default": _database(os.environ.get("DATABASE_URL"))}

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
