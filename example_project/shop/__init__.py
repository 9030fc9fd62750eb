"""The shop: orders whose side effects are recorded as intents."""
