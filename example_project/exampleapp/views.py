"""Pages of the example project: open ``/slow/`` in two tabs and watch the admin."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from django_tasklock import TaskLockService, run_exclusive

REPORT_KEY = "slow-report"
REPORT_SECONDS = 20


def home(request: HttpRequest) -> HttpResponse:
    return HttpResponse(
        format_html(
            "<h1>django-tasklock example</h1><ul>"
            '<li><a href="/slow/">/slow/</a>: builds a report for {} s under the lock {}; '
            "open it in two tabs: the second is refused while the first runs.</li>"
            '<li><a href="/admin/django_tasklock/cacheentry/">Task locks</a> in the admin '
            "(after <code>manage.py setup</code>: admin / admin).</li></ul>",
            REPORT_SECONDS,
            REPORT_KEY,
        )
    )


def slow_report(request: HttpRequest) -> HttpResponse:
    result = run_exclusive(REPORT_KEY, lambda: _build_report(REPORT_SECONDS), ttl=10)
    if result.acquired:
        return HttpResponse(f"Report built: {result.result} rows.", content_type="text/plain")
    held = TaskLockService().peek(REPORT_KEY)
    holder = f" by {held.holder}" if held is not None else ""
    return HttpResponse(
        f"Another request is building the report{holder}; try again later.",
        status=409,
        content_type="text/plain",
    )


def _build_report(seconds: int) -> int:
    time.sleep(seconds)  # stands in for the real queries
    return 42
