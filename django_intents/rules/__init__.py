"""The queue's rules as plain Python, below everything else: states and the claim order,
retries and backoff, limits, identity, validation, batch sizes, kinds and cron.

Nothing here touches a database or imports another layer of the package, so
the model, the store, the pool and the admin all read one definition of
each rule.
"""
