"""The handlers a worker of the previous release runs in tests/test_rolling_upgrade.py.

It uses only what 0.1.0 offered (``@handler``), so the same app loads with the
previous release's code and with this one's.
"""
