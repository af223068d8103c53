"""Keys marked "run once more" (``on_locked="rerun"``), in ``tasklock_reruns``.

On MySQL/MariaDB its ``key`` gets the same byte-for-byte collation as
``cache_entries.key`` (see 0002), so that two different keys never share one
mark.
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
        f"ALTER TABLE {quote('tasklock_reruns')} MODIFY {quote('key')} "
        f"varchar(255) CHARACTER SET utf8mb4 COLLATE {_bytes._binary_collation(connection)} "
        "NOT NULL"
    )


class Migration(migrations.Migration):
    dependencies = [("django_tasklock", "0005_forcedrelease")]

    operations = [
        migrations.CreateModel(
            name="RerunMark",
            fields=[
                ("key", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("payload", models.TextField(null=True)),
                ("marked_at", models.DateTimeField(null=True)),
                ("taken_by", models.TextField(default="")),
                ("taken_number", models.BigIntegerField(default=0)),
                ("taken", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "rerun mark",
                "verbose_name_plural": "rerun marks",
                "db_table": "tasklock_reruns",
            },
        ),
        # MySQL cannot roll DDL back: no transaction around it.
        migrations.RunPython(forwards, migrations.RunPython.noop, atomic=False),
    ]
