"""What the queue shows operators: metrics, the queue gauges, the backlog and its estimate.

``log`` is the layer's one logger (``django_intents.observability``).
"""

import logging

log = logging.getLogger(__name__)
