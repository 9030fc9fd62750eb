"""How much one statement may carry: the largest batch, and the largest claim.

``INSERT_BATCH`` bounds the rows of one ``INSERT`` and the claims of one
fenced batch (``enqueue_many``, ``complete_many``, ``finish_many``, the
completions a claim carries): a longer list is written as several
statements in one transaction, so no statement outgrows what a database
takes in parameters or in one packet. ``MAX_LIMIT`` is the largest ``LIMIT``
a claim passes: the largest SQL ``bigint``, which every database accepts.
"""

from __future__ import annotations

INSERT_BATCH = 500
MAX_LIMIT = 2**63 - 1
