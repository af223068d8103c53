"""Force releases leave a record for 24 h (``tasklock_forced_releases``).

A holder's release sent again after its reply was lost reads it to tell an
operator's deletion of its lease (a loss) from its own first sending's (none).
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_tasklock", "0004_task_lock_verbose_names")]

    operations = [
        migrations.CreateModel(
            name="ForcedRelease",
            fields=[
                (
                    "lease",
                    models.CharField(max_length=64, primary_key=True, serialize=False),
                ),
                ("released_at", models.DateTimeField(db_index=True)),
            ],
            options={
                "verbose_name": "forced release",
                "verbose_name_plural": "forced releases",
                "db_table": "tasklock_forced_releases",
            },
        ),
    ]
