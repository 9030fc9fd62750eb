"""The worker pool: claims, runs handlers, records results, renews leases.

``log`` is the pool's one logger: operators filter on ``django_intents.worker``
for everything a pool says.
"""

import logging

log = logging.getLogger(__name__)
