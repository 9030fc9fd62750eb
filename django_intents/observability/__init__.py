"""What the queue shows operators: metrics, gauges, traces, the backlog.

``log`` is the layer's one logger (``django_intents.observability``).
"""

import logging

log = logging.getLogger(__name__)
