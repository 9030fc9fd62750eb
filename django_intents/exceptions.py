"""Exceptions a handler raises or receives."""


class Stop(Exception):  # noqa: N818 - a public name, not an error class
    """Raised by a handler to cancel its intent for good; the message is kept as ``last_error``."""


class ClaimLost(Exception):  # noqa: N818 - a public name, not an error class
    """The worker no longer holds the claim: another worker or an administrator took over."""
