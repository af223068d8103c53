"""Keys compare byte for byte: a binary, NO PAD collation for ``key`` on MySQL/MariaDB.

Their default collations fold case and accents ("Report" = "report",
"résumé" = "resume"), and ``utf8mb4_bin`` still pads trailing spaces
("report " = "report"), so two different keys would be one lock. SQLite's
``BINARY`` and PostgreSQL's deterministic collations already compare bytes:
nothing to do there. The model's state is unchanged (no ``db_collation``:
no one collation name exists on every database).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _binary_collation(connection: Any) -> str:
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    if connection.mysql_version >= (8, 0, 17):
        return "utf8mb4_0900_bin"  # MySQL's NO PAD binary collation
    return "utf8mb4_bin"  # older MySQL: no NO PAD collation; case and accents still differ


def _set_key_collation(schema_editor: Any, collation: str | None) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    column = "varchar(255) CHARACTER SET utf8mb4"
    if collation is not None:
        column += f" COLLATE {collation}"
    schema_editor.execute(
        f"ALTER TABLE {schema_editor.quote_name('cache_entries')} "
        f"MODIFY {schema_editor.quote_name('key')} {column} NOT NULL"
    )


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        _set_key_collation(schema_editor, _binary_collation(schema_editor.connection))


def backwards(apps: Any, schema_editor: Any) -> None:
    _set_key_collation(schema_editor, None)


class Migration(migrations.Migration):
    dependencies = [("django_tasklock", "0001_initial")]

    # MySQL cannot roll DDL back: no transaction around it.
    operations = [migrations.RunPython(forwards, backwards, atomic=False)]
