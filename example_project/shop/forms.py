from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

from .models import Partner

# How the shop's own receiver should behave for this order's webhook: the query
# string appended to its URL. Lets a visitor watch success, retries with backoff,
# and a cancellation without any partner of their own.
PARTNER_BEHAVIOURS = {
    "ok": ("answers 200", ""),
    "recovering": ("refuses the first delivery with 503 (one retry)", "?fail_first=1"),
    "flaky": ("refuses 50% of deliveries with 503 (retries)", "?fail=0.5"),
    "down": ("always answers 503 (retried until MAX_ATTEMPTS)", "?fail=1"),
    "gone": ("answers 410 Gone (cancelled at once)", "?status=410"),
}


class OrderForm(forms.Form):
    customer = forms.CharField(max_length=100, initial="ada@example.com")
    item = forms.CharField(max_length=200, initial="Espresso machine")
    total = forms.DecimalField(
        max_digits=10, decimal_places=2, min_value=Decimal("0.01"), initial=Decimal("249.00")
    )
    partner = forms.ChoiceField(
        label="Partner webhook",
        choices=[(key, label) for key, (label, _) in PARTNER_BEHAVIOURS.items()],
        initial="ok",
    )
    push_inline = forms.BooleanField(
        label="Send the push inline (complete_pending) instead of by a worker",
        required=False,
    )

    def partner_query(self) -> str:
        data: dict[str, Any] = self.cleaned_data
        return PARTNER_BEHAVIOURS[data["partner"]][1]


class PartnerForm(forms.ModelForm):
    """The partner page's switch: how the receiver answers from now on."""

    class Meta:
        model = Partner
        fields = ("mode", "rate", "retry_after", "retry_after_as_date")
        widgets = {"mode": forms.RadioSelect}
