"""Exceptions a handler raises or receives."""


class Stop(Exception):  # noqa: N818 - SPEC §4 names it
    """Raised by a handler to cancel its intent for good; the message is kept as ``last_error``."""


class ClaimLost(Exception):  # noqa: N818 - SPEC §4 names it
    """The worker no longer holds the claim: another worker or an administrator took over."""
