from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("report/<str:name>/", views.report),
    path("async/<str:name>/", views.async_report),
    path("class/<str:name>/", views.ReportView.as_view()),
    path("async-class/<str:name>/", views.AsyncReportView.as_view()),
    path("slow/<str:name>/", views.slow),
    path("non-atomic/<str:name>/", views.non_atomic),
]
