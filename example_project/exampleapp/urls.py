"""The admin (with its "Task locks" page), a slow page under a lock, and a home page."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, path

from exampleapp import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.home, name="home"),
    path("slow/", views.slow_report, name="slow-report"),
    path("admin/", admin.site.urls),
]
