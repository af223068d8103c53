"""Fence counters (``fencing=True``) in a table of their own, ``tasklock_fences``.

On MySQL/MariaDB its ``key`` gets the same byte-for-byte collation as
``cache_entries.key`` (see 0002), so that two different keys never share one
counter.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.db import migrations, models

_bytes = importlib.import_module("django_tasklock.migrations.0002_key_byte_for_byte")


def forwards(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    quote = schema_editor.quote_name
    schema_editor.execute(
        f"ALTER TABLE {quote('tasklock_fences')} MODIFY {quote('key')} "
        f"varchar(255) CHARACTER SET utf8mb4 COLLATE {_bytes._binary_collation(connection)} "
        "NOT NULL"
    )


class Migration(migrations.Migration):
    dependencies = [("django_tasklock", "0002_key_byte_for_byte")]

    operations = [
        migrations.CreateModel(
            name="FenceCounter",
            fields=[
                ("key", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("value", models.BigIntegerField()),
            ],
            options={
                "verbose_name": "fence counter",
                "verbose_name_plural": "fence counters",
                "db_table": "tasklock_fences",
            },
        ),
        # MySQL cannot roll DDL back: no transaction around it.
        migrations.RunPython(forwards, migrations.RunPython.noop, atomic=False),
    ]
