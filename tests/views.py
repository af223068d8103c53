"""Views under @exclusive, served by ``tests.urls`` in the view tests."""

from __future__ import annotations

import threading

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_tasklock import exclusive

#: Set by a test to let ``slow`` views finish; ``entered`` is set once one is inside.
release = threading.Event()
entered = threading.Event()


@exclusive("view:{name}", ttl=30)
def report(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse(f"report {name}")


@exclusive("view:{name}", ttl=30)
async def async_report(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse(f"async report {name}")


class ReportView(View):
    @method_decorator(exclusive("view:{name}", ttl=30))
    def get(self, request: HttpRequest, name: str) -> HttpResponse:
        return HttpResponse(f"class report {name}")


class AsyncReportView(View):
    # method_decorator keeps an async method async from Django 5.0 on.
    @method_decorator(exclusive("view:{name}", ttl=30))
    async def get(self, request: HttpRequest, name: str) -> HttpResponse:
        return HttpResponse(f"async class report {name}")


@exclusive("view:{name}", ttl=30)
def slow(request: HttpRequest, name: str) -> HttpResponse:
    entered.set()
    release.wait(timeout=60)
    return HttpResponse(f"slow {name}")


@transaction.non_atomic_requests
@exclusive("view:{name}", ttl=30)
def non_atomic(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse(f"non-atomic {name}")
