"""Media for render: a URL's bytes under a policy (fetch, sources), image and audio checks."""

from .addresses import is_allowed_domain
from .audio import AudioDecoding, AudioLimits
from .fetch import Resolver
from .loader import MediaLoader
from .policy import MediaPolicy

__all__ = [
    "AudioDecoding",
    "AudioLimits",
    "MediaLoader",
    "MediaPolicy",
    "Resolver",
    "is_allowed_domain",
]
