from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("example_project.shop.urls")),
    # /metrics: the web process's view of the queue (gauges, admin transitions).
    path("", include("django_prometheus.urls")),
]
