from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.index, name="index"),
    path("orders/", views.place_order, name="place-order"),
    path("status/", views.status, name="status"),
    path("partner/", views.partner, name="partner"),
    path("webhooks/receive/", views.receive_webhook, name="receive-webhook"),
]
