"""tandem_http: HTTP plumbing shared by the render and generate services (no vLLM, no torch)."""

from .admission import AdmissionGate, HeldStreamingResponse, Slot, admitted
from .auth import ApiKeyMiddleware, api_keys, principal_of
from .body import (
    AcceptEncodingMiddleware,
    BodyTooLarge,
    PartsResponse,
    negotiate,
    read_body,
    read_raw_body,
    wire_response,
)
from .draining import DRAINING_HEADER, Drain, DrainingConfig, DrainingServer
from .errors import (
    BadRequest,
    MmEmbedsDisabled,
    ModelNotFound,
    Overloaded,
    PromptTooLong,
    TokenOutOfVocabulary,
    TooManyItems,
    error_body,
    error_response,
    install_error_handlers,
)
from .memory import keep_freed_memory, pretouch, startup_objects_frozen
from .metrics import (
    MULTIPROC_ENV,
    mark_process_dead,
    metrics_registry,
    metrics_response,
    prepare_multiprocess_dir,
)
from .request_id import REQUEST_ID_HEADER, RequestIdMiddleware, request_id_of
from .server import run_server
from .service_app import models_response, service_app
from .settings_json import (
    serve_settings,
    settings_from_cli,
    settings_from_json,
    settings_to_json,
)

__all__ = [
    "DRAINING_HEADER",
    "MULTIPROC_ENV",
    "REQUEST_ID_HEADER",
    "AcceptEncodingMiddleware",
    "AdmissionGate",
    "ApiKeyMiddleware",
    "BadRequest",
    "MmEmbedsDisabled",
    "BodyTooLarge",
    "Drain",
    "DrainingConfig",
    "DrainingServer",
    "HeldStreamingResponse",
    "ModelNotFound",
    "Overloaded",
    "PartsResponse",
    "PromptTooLong",
    "RequestIdMiddleware",
    "Slot",
    "admitted",
    "api_keys",
    "TokenOutOfVocabulary",
    "TooManyItems",
    "error_body",
    "error_response",
    "install_error_handlers",
    "keep_freed_memory",
    "mark_process_dead",
    "metrics_registry",
    "metrics_response",
    "models_response",
    "negotiate",
    "prepare_multiprocess_dir",
    "pretouch",
    "principal_of",
    "read_body",
    "read_raw_body",
    "request_id_of",
    "run_server",
    "serve_settings",
    "service_app",
    "startup_objects_frozen",
    "settings_from_cli",
    "settings_from_json",
    "settings_to_json",
    "wire_response",
]
