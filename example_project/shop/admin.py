from __future__ import annotations

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import ngettext

from .models import Order, PushLog, Receipt, ReceivedWebhook


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "item", "total", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("customer", "item")
    actions = ("mark_shipped",)

    @admin.action(description="Mark selected orders shipped", permissions=["change"])
    def mark_shipped(self, request: HttpRequest, queryset: QuerySet[Order]) -> None:
        """Ship orders one ``save()`` at a time, so each one's ``post_save`` records a push.

        ``queryset.update()`` would send no signal and so record no intent.
        """
        shipped = 0
        with transaction.atomic():
            for order in queryset.select_for_update().exclude(status=Order.Status.SHIPPED):
                order.status = Order.Status.SHIPPED
                order.save(update_fields=["status"])
                shipped += 1
        self.message_user(
            request,
            ngettext(
                "%d order shipped; its push is on its way.",
                "%d orders shipped; their pushes are on their way.",
                shipped,
            )
            % shipped,
            messages.SUCCESS,
        )


@admin.register(PushLog)
class PushLogAdmin(admin.ModelAdmin):
    list_display = ("sent_at", "recipient", "message", "sent_by", "intent_id")
    list_filter = ("sent_by",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Receipt)
class ReceiptAdmin(admin.ModelAdmin):
    list_display = ("sent_at", "order", "recipient", "text")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ReceivedWebhook)
class ReceivedWebhookAdmin(admin.ModelAdmin):
    list_display = ("received_at", "key", "attempt", "deliveries")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
