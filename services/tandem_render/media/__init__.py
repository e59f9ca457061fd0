"""Media for render: a URL's bytes under a policy (fetch, sources) and image checks."""

from .addresses import is_allowed_domain
from .fetch import Resolver
from .loader import MediaLoader
from .policy import MediaPolicy

__all__ = ["MediaLoader", "MediaPolicy", "Resolver", "is_allowed_domain"]
