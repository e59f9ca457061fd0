"""tandem_http's public names are pinned, and importing it pulls in no engine or service."""

from __future__ import annotations

import subprocess
import sys

import tandem_http


def test_public_api_is_pinned() -> None:
    assert sorted(tandem_http.__all__) == sorted(
        [
            "DRAINING_HEADER",
            "usable_cores",
            "MAX_BODY_HEADER",
            "MULTIPROC_ENV",
            "REQUEST_ID_HEADER",
            "TENANT_HEADER",
            "Drain",
            "DrainingConfig",
            "DrainingServer",
            "ADMIN_KEY_ENV",
            "AdminRequired",
            "ApiKeyMiddleware",
            "ControlAccess",
            "ControlRoutesDisabled",
            "is_admin",
            "keys_from_env",
            "BadRequest",
            "MmEmbedsDisabled",
            "BodyTooLarge",
            "BodyDeadline",
            "BodyDeadlineMiddleware",
            "BodyTimeout",
            "AcceptEncodingMiddleware",
            "AdmissionGate",
            "Slot",
            "add_body_deadline_flags",
            "admitted",
            "body_chunks",
            "decoded",
            "CONTROL_BODY_BYTES",
            "default_held_bytes",
            "held_bytes_budget",
            "memory_limit",
            "slot_of",
            "startup_objects_frozen",
            "api_keys",
            "ModelNotFound",
            "Overloaded",
            "PartsResponse",
            "PromptTooLong",
            "RequestIdMiddleware",
            "SendDeadline",
            "SendDeadlineMiddleware",
            "SendTimeout",
            "TransportInScope",
            "add_send_deadline_flags",
            "TokenOutOfVocabulary",
            "TooManyItems",
            "VllmBadRequest",
            "error_body",
            "error_response",
            "install_error_handlers",
            "keep_freed_memory",
            "mark_process_dead",
            "metrics_registry",
            "metrics_response",
            "add_server_info_routes",
            "add_uds_argument",
            "models_response",
            "negotiate",
            "prepare_multiprocess_dir",
            "pretouch",
            "principal_of",
            "program_name",
            "read_body",
            "read_raw_body",
            "request_id_of",
            "run_server",
            "serve",
            "serve_settings",
            "service_app",
            "settings_from_cli",
            "settings_from_json",
            "settings_to_json",
            "wire_response",
        ]
    )
    for name in tandem_http.__all__:
        assert hasattr(tandem_http, name), name


def test_imports_no_vllm_torch_or_service() -> None:
    code = "import sys, tandem_http; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    roots = {m.split(".")[0] for m in out.stdout.split()}
    assert not roots & {"vllm", "torch", "transformers", "tandem_render", "tandem_generate"}
