from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_tasklock", "0001_initial")]

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
    ]
