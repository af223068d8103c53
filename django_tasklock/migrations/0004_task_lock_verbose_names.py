"""The admin names the model after what it lists: "task lock", "task locks".

Model options only: no table, column or permission codename changes.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_tasklock", "0003_fencecounter"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="cacheentry",
            options={
                "permissions": [("force_release", "Can force-release task locks")],
                "verbose_name": "task lock",
                "verbose_name_plural": "task locks",
            },
        ),
    ]
