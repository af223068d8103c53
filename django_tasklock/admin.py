"""The "Task locks" admin page: the held locks of the active backend, and force release.

The page lists what the backend chosen by ``TASKLOCK_BACKEND`` reports, not rows
of a table, so it works the same on Redis. It hangs off a read-only ModelAdmin
of ``CacheEntry`` (whose changelist it replaces), the way django-rq adds its
pages, rather than faking a model's ``_meta``.

Who may do what:

- viewing: staff with ``django_tasklock.view_cacheentry`` or
  ``django_tasklock.force_release`` (superusers have both);
- force release: ``django_tasklock.force_release`` only, after a confirmation
  page, by POST with a CSRF token; anything else is a 403. The link and the
  form carry the name of the lease shown (:attr:`HeldLock.lease`, a digest of
  its token), and only that lease is released: if the key changed hands
  meanwhile, the page says who holds it now and releases nothing. Each release is
  written to the admin's log (``LogEntry``, action "deletion", content type
  ``CacheEntry``, ``object_repr`` the caller's key, ``object_id`` the stored
  key), so it appears in "Recent actions".

With a backend that marks keys "run once more" (``on_locked="rerun"``,
``capabilities.rerun``), a column Rerun says "marked" of each marked key
held (since when in its tooltip: the column is kept narrow, for 1280 px),
and a marked key nobody holds (its holder raised, lost its lease or died)
is a line of its own, with nothing to release. The marks are read once for
the page (``rerun_marks()``), not per row.

A ``limit=N`` key held by permits is one entry of the list, saying how many
of its N permits are held ("2 of 3 permits held"), with a row for each permit
by its number (as stored, from 0). A permit is named by its key and its number
(``?key=&permit=``), never by its stored name: the key is validated as any
key, which refuses the separator the stored name holds. Its release is logged
with ``object_repr`` ``"<key> (permit <n>)"`` and ``object_id`` the permit's
stored key.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import django
from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import capfirst

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import HeldLock, permit_key, storage_key
from django_tasklock.locking.options import validate_key
from django_tasklock.models import CacheEntry
from django_tasklock.ops import display

logger = logging.getLogger("django_tasklock")

FORCE_RELEASE_PERMISSION = "django_tasklock.force_release"
#: Django 6.1's admin writes (and styles) breadcrumbs as ``<ol class="breadcrumbs">``
#: of ``<li>``; before, as ``<div class="breadcrumbs">`` with ``&rsaquo;`` between.
BREADCRUMBS_AS_LIST = django.VERSION >= (6, 1)


def _row(lock: HeldLock) -> dict[str, Any]:
    return {
        "key": display.key(lock),
        "permit": display.permit(lock),
        "host": lock.holder.host,
        "pid": lock.holder.pid,
        "gone": display.gone(lock),
        # Without " UTC" (the headers say it), so that every column fits 1280 px.
        "acquired_at": display.when(lock.acquired_at, zone=False),
        "expires_at": display.when(lock.expires_at, zone=False),
        "held_for": display.duration(display.seconds_held(lock)),
        "time_left": display.duration(lock.seconds_left),
        "fence": display.fence(lock),
        "lease": lock.lease,
    }


def _group(held: display.Held, marked_at: datetime | None = None) -> dict[str, Any]:
    """One key of the list: its rows, (held as permits) how many are held, and when it
    was last marked to run once more (None: not marked)."""
    rerun = None if marked_at is None else display.when(marked_at, zone=False)
    return {
        "key": held.key,
        "held": True,
        "limited": held.limited,
        "permits_held": display.permits_held(len(held.permits), held.limit),
        "rows": [{**_row(lock), "rerun": rerun} for lock in held.locks],
    }


def _unheld(key: str, marked_at: datetime) -> dict[str, Any]:
    """A key marked to run once more that nobody holds: one line, no lease to release."""
    return {"key": key, "held": False, "not_held": display.not_held(marked_at), "rows": []}


def _permit(value: str) -> int | None:
    """The ``permit`` of a link or form: its number, or None (a mutex); ValueError otherwise."""
    if not value:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 6:
        raise ValueError(f"a permit's number, as the list shows it, not {value!r}")
    return int(value)


def _permits(backend: Any, key: str) -> display.Held | None:
    """The permits of ``key`` held now; None for a mutex or a free key."""
    if not backend.capabilities.permits:
        return None  # none to look for (and Redis would list by a scan of every key)
    held = [held for held in display.by_key(backend.list()) if held.key == key]
    return held[0] if held and held[0].limited else None


@admin.register(CacheEntry)
class TaskLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: no adding, changing or deleting rows; only the pages below."""

    list_template = "admin/django_tasklock/task_locks.html"
    release_template = "admin/django_tasklock/release_confirmation.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_force_release_permission(request) or request.user.has_perm(
            "django_tasklock.view_cacheentry"
        )

    def has_force_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(FORCE_RELEASE_PERMISSION)

    def breadcrumbs(self, *pages: tuple[str, str | None]) -> dict[str, Any]:
        """Context for the breadcrumbs include: Home, the app, then ``pages``.

        The app's crumb is left out when it says what the first page says
        ("Task locks"): "Home > Task locks > Task locks" reads as a mistake.
        """
        app = self.opts.app_config
        assert app is not None
        crumbs: list[tuple[str, str | None]] = [("Home", reverse(f"{self.admin_site.name}:index"))]
        if str(app.verbose_name) != pages[0][0]:
            url = reverse(f"{self.admin_site.name}:app_list", kwargs={"app_label": app.label})
            crumbs.append((str(app.verbose_name), url))
        crumbs += pages
        return {"crumbs": crumbs, "breadcrumbs_as_list": BREADCRUMBS_AS_LIST}

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name=f"{name}_changelist"),
            path("release/", wrap(self.release_view), name=f"{name}_release"),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The held locks, searchable by key (``?q=``, any part, any case)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.get("q", "").strip()
        error = None
        marks: dict[str, datetime] | None = None
        try:
            backend = TaskLockService().backend
            locks = backend.list()
            if backend.capabilities.rerun:  # once for the page, not per row
                marks = backend.rerun_marks()
        except Exception as exc:  # an unreachable storage is shown, not a 500
            logger.warning("The Task locks page could not list locks.", exc_info=True)
            locks, error = [], f"{type(exc).__name__}: {exc}"
        total = len(display.by_key(locks))
        if query:  # in the caller's key: a permit's stored name is nobody's to search
            locks = [lock for lock in locks if query.casefold() in display.key(lock).casefold()]
            marks = marks and {
                key: when for key, when in marks.items() if query.casefold() in key.casefold()
            }
        marks = marks or {}
        groups = display.by_key(locks)
        listed = [
            _unheld(key, marks[key]) if held is None else _group(held, marks.get(key))
            for key, held in display.with_unheld(groups, marks, lambda held: held.key)
        ]
        show_fence = display.has_fences(locks)
        show_rerun = any(held.key in marks for held in groups)
        can_release = self.has_force_release_permission(request)
        context = {
            **self.admin_site.each_context(request),
            "title": "Task locks",
            "subtitle": None,
            "opts": self.opts,
            "storage": None if error else display.storage(backend),
            "groups": listed,
            "shown": len(groups),
            "leases": len(locks),
            "total": total,
            "unheld": len(listed) - len(groups),
            "query": query,
            "error": error,
            "show_fence": show_fence,
            "show_rerun": show_rerun,
            # the columns after Key, which a key's one line (its permits, or a mark) spans
            "span": 6 + show_fence + show_rerun + can_release,
            "can_release": can_release,
            **self.breadcrumbs((self._plural, None)),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.list_template, context)

    def release_view(self, request: HttpRequest) -> HttpResponse:
        """GET: ask to confirm releasing the lease ``?lease=`` of ``?key=``. POST: release it.

        What is confirmed is released, and nothing else: the POST names the
        lease the confirmation page showed, so a key that changed hands in
        between keeps its new holder.
        """
        if not self.has_force_release_permission(request):
            raise PermissionDenied
        if request.method not in {"GET", "POST"}:
            return HttpResponseNotAllowed(["GET", "POST"])
        data = request.POST if request.method == "POST" else request.GET
        back = HttpResponseRedirect(reverse(f"{self.admin_site.name}:{self._url_name}"))
        lease = data.get("lease", "")
        try:
            key = validate_key(data.get("key", ""))
            permit = _permit(data.get("permit", ""))
            if request.method == "POST" and not lease:
                raise ValueError("the form named no lease; reload the page")
        except ValueError as exc:
            messages.error(request, f"Cannot release: {exc}.")
            return back
        name = key if permit is None else permit_key(key, permit)
        what = display.named(key, permit)
        try:
            backend = TaskLockService().backend
            if request.method == "POST":
                ended = backend.force_release(name, lease=lease)
                shown = None if ended is not None else backend.peek(name)
            else:
                ended, shown = None, backend.peek(name)
            permits = None if ended or shown or permit is not None else _permits(backend, key)
        except Exception as exc:
            logger.warning("Force release from the admin failed.", exc_info=True)
            messages.error(request, f"The lock backend failed: {type(exc).__name__}: {exc}")
            return back
        if ended is not None:
            self._log_release(request, ended)
            messages.success(
                request, f"Released {what} (was held by {ended.holder}, lease {ended.lease})."
            )
            return back
        if permits:  # a link without its permit: which one is for the operator to say
            numbers = ", ".join(str(n) for n in permits.permits)
            held = display.permits_held(len(permits.permits), permits.limit)
            messages.warning(
                request,
                f"{what} is held as permits, {held} (number "
                f"{numbers}): release one of them from the list. Nothing was released.",
            )
            return back
        if shown is None:
            messages.warning(request, f"{what} is not held (any more): nothing to release.")
            return back
        if lease and shown.lease != lease:
            messages.warning(
                request,
                f"{what} changed hands since the page was shown: it is held now by "
                f"{display.lease(shown)}. Nothing was released.",
            )
            return back
        context = {
            **self.admin_site.each_context(request),
            "title": "Force-release a task lock?",
            "subtitle": None,
            "opts": self.opts,
            "lock": _row(shown),
            **self.breadcrumbs(
                (
                    self._plural,
                    reverse(f"{self.admin_site.name}:{self._url_name}"),
                ),
                ("Force release", None),
            ),
        }
        return TemplateResponse(request, self.release_template, context)

    @property
    def _plural(self) -> str:
        return str(capfirst(self.opts.verbose_name_plural))

    @property
    def _url_name(self) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_changelist"

    def _log_release(self, request: HttpRequest, held: HeldLock) -> None:
        # Not log_deletion/log_action: there may be no row (Redis), and their
        # signatures change across Django versions. The stored key is the
        # row's primary key on the database backend.
        user = request.user
        assert user.is_authenticated  # admin_view lets nobody else in
        key, permit = display.key(held), display.permit(held)
        LogEntry.objects.create(
            user=user,
            content_type_id=ContentType.objects.get_for_model(CacheEntry).pk,
            object_id=storage_key(held.key),
            object_repr=(key if permit is None else f"{key} (permit {permit})")[:200],
            action_flag=DELETION,
            change_message=(
                f"Force-released {'the task lock' if permit is None else f'permit {permit}'} "
                f"held by {held.holder} (lease {held.lease})."
            ),
        )
        logger.warning(
            "Task lock %s held by %s was force-released by %s in the admin.",
            display.named(key, permit),
            held.holder,
            request.user,
        )
