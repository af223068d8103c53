"""How the database backend takes a key: one INSERT, and a look at the row only on a conflict.

Atomicity comes from the primary key: two concurrent inserts of one key cannot
both succeed, so an ``IntegrityError`` on the key means "held", once the row
is seen to exist. That one look also says whether the row is free to take
over (expired, or older than 24 h: see ``rows``), by the server's clock; a
stale row is deleted by its holder's token and the INSERT sent again. So is
a live row whose holder is provably gone (``processes.holder_gone``: a process
of this machine that no longer runs): the DELETE names its token, so of two
processes doing so at once, one deletes it, and one INSERT wins. A limited
key's anchor row (``permits``) is refused while a permit of it lives, and
deleted otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from django.db import IntegrityError, connections

from django_tasklock.backends.base import Holder
from django_tasklock.backends.database import rows as db_rows
from django_tasklock.backends.database.connections import (
    is_key_conflict,
    savepoint_if_in_transaction,
)
from django_tasklock.backends.database.functions import Compiled, UtcNow
from django_tasklock.backends.database.permits import anchor_limit, settle_anchor
from django_tasklock.backends.database.statements import HolderLook
from django_tasklock.exceptions import LimitMismatch
from django_tasklock.processes import holder_gone

if TYPE_CHECKING:
    from django_tasklock.models import CacheEntry

# Attempts at the INSERT when the key keeps changing hands between our INSERT
# and our look at the row (or an abandoned row is taken over).
_ACQUIRE_ATTEMPTS = 5
# The row's created_at: the server's clock, compiled once per database.
_NOW = Compiled(UtcNow())
# Per model and alias, the manager bound to it: QuerySet.using() would clone a
# queryset at every acquisition.
_managers: dict[tuple[type[Any], str], Any] = {}
# Per model and alias, the look at a key's row after a conflict.
_looks: dict[tuple[type[Any], str], HolderLook] = {}


def insert_lease(
    model: type[CacheEntry], alias: str, stored: str, token: str, expires_at: Any
) -> Literal["inserted", "ours", "held"]:
    """Insert ``token``'s row for ``stored`` on ``alias``, taking over a stale row.

    ``"inserted"``: this INSERT wrote the row. ``"ours"``: the live row was
    already ``token``'s (this INSERT sent again after its reply was lost).
    ``"held"``: another holder's live row, or the key changed hands at every
    attempt. ``expires_at``: the row's expiry, an expression on the server's clock.
    """
    for _ in range(_ACQUIRE_ATTEMPTS):
        try:
            with savepoint_if_in_transaction(alias):
                _manager(model, alias).create(
                    key=stored,
                    value=token,
                    expires_at=expires_at,
                    created_at=_NOW,
                )
        except IntegrityError as exc:
            # "Held" only once the row is seen; one look also says whether
            # it is free to take over, by the server's clock.
            seen = _holder_look(model, alias).run(alias, stored)
            if seen is None:
                if not is_key_conflict(exc):
                    raise  # not a key conflict after all: a real error
                continue  # the holder released between our INSERT and our look
            holder, live = seen
            if anchor_limit(holder) is not None:
                # A limited key's anchor: refused while a permit of it lives,
                # else the anchor is deleted and the INSERT sent again.
                try:
                    settle_anchor(model, alias, stored, holder)
                except LimitMismatch as refused:
                    raise refused from None  # not a consequence of the INSERT's conflict
                continue
            if live and holder == token:
                return "ours"  # our own row: this INSERT sent again after its reply was lost
            if live and holder_gone(Holder.from_token(holder)) is not True:
                return "held"
            if live:
                # Its holder is gone: delete its row, live or not (its token is
                # never reused, so a new holder's row is safe), and insert again.
                rows = model.objects.using(alias).filter(key=stored, value=holder)
                rows._raw_delete(alias)
                continue
            # Expired or abandoned: delete that holder's row (a token is
            # never reused, so a new holder's row is safe) and insert again.
            # The DELETE judges staleness again, by the server's clock: the
            # holder's refresh may have extended the row since our look.
            db_rows.stale(model, alias).filter(key=stored, value=holder)._raw_delete(alias)
        else:
            return "inserted"
    # The key changed hands at every attempt: it was held each time we asked.
    return "held"


def _holder_look(model: type[CacheEntry], alias: str) -> HolderLook:
    """The compiled look at a key's row (``statements.HolderLook``) for ``alias``'s engine."""
    engine = connections[alias].settings_dict["ENGINE"]
    look = _looks.get((model, alias))
    if look is None or look.engine != engine:
        look = _looks[model, alias] = HolderLook(model, alias)
    return look


def _manager(model: type[CacheEntry], alias: str) -> Any:
    manager = _managers.get((model, alias))
    if manager is None:
        manager = _managers[model, alias] = model.objects.db_manager(alias)
    return manager
