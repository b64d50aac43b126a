"""The one error the local platform raises about itself."""

from __future__ import annotations


class PlatformError(RuntimeError):
    """A component of the local platform did not start or is not healthy."""
