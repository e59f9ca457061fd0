"""Every ``type`` string an error body can carry (``{"error": {"type": ...}}``), defined once.

Data only. Services raise errors whose ``type`` is one of these; the client maps them back to its
exceptions. A type string is part of the wire contract: never change one, only add.
"""

from __future__ import annotations

# Any service, any route (tandem_http's handlers and shared errors).
INVALID_REQUEST = "invalid_request"
"""400: the request is malformed or a field value is not acceptable."""
UNAUTHORIZED = "unauthorized"
"""401: missing or wrong API key."""
FORBIDDEN = "forbidden"
"""403 from routing (no Tandem error class)."""
NOT_FOUND = "not_found"
"""404: no such route."""
METHOD_NOT_ALLOWED = "method_not_allowed"
"""405: the route does not take this method."""
PAYLOAD_TOO_LARGE = "payload_too_large"
"""413: a body, tensor, dimension or item limit was exceeded."""
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
"""415 from routing."""
OVERLOADED = "overloaded"
"""429: too many requests waiting; retry later (``Retry-After`` when the service knows)."""
UNAVAILABLE = "unavailable"
"""503 from routing."""
SHUTTING_DOWN = "shutting_down"
"""503: the server is draining before it exits; the request was not run (retry elsewhere)."""
BODY_TIMEOUT = "body_timeout"
"""408: the request body did not arrive in time (nothing for ``--body-timeout-s``, or slower on
average than ``--body-min-rate`` past that grace); the request was not run, its connection is
closed."""
HTTP_ERROR = "http_error"
"""Any other 4xx raised by routing."""
INTERNAL_ERROR = "internal_error"
"""5xx: a bug; the message names only the request id."""
MODEL_NOT_FOUND = "model_not_found"
"""404: ``model`` names a model this server does not serve."""
PROMPT_TOO_LONG = "prompt_too_long"
"""400: the prompt (plus ``max_tokens`` on generate) does not fit the context."""
TOKEN_OUT_OF_VOCABULARY = "token_out_of_vocabulary"
"""400: a token id outside the model's vocabulary."""
TOO_MANY_ITEMS = "too_many_items"
"""400: more images/videos in one prompt than the configured limit."""
BAD_REQUEST_ERROR = "BadRequestError"
"""400: refused by one of vLLM's own rules (a model's item limit, a chat template's), typed as
vLLM's servers type it, so a client of ``vllm serve`` reads the refusal the same; the one type
spelled as vLLM spells it, in CamelCase."""
MM_EMBEDS_DISABLED = "mm_embeds_disabled"
"""400: precomputed embeddings (an ``image_embeds`` content part on render, an embedding item on
generate) sent to a server started without ``--enable-mm-embeds``."""

# Wire decoding (tandem_wire.WireError); a few also use INVALID_REQUEST / PAYLOAD_TOO_LARGE.
MALFORMED_BODY = "malformed_body"
"""400: the body is not well-formed JSON or msgpack."""
MALFORMED_STREAM_FRAME = "malformed_stream_frame"
"""400: a frame of generate's binary stream that is cut short, of an unknown kind, or whose
payload is not the msgpack document its kind says."""
MALFORMED_BASE64 = "malformed_base64"
"""400: a base64 string is not valid base64."""
UNSUPPORTED_EXT_TYPE = "unsupported_ext_type"
"""400: a msgpack extension other than raw tensor bytes."""
UNSUPPORTED_DTYPE = "unsupported_dtype"
"""400: a tensor dtype outside the allowlist."""
SHAPE_MISMATCH = "shape_mismatch"
"""400: a tensor's shape disagrees with its byte count, or is not a shape."""
INVALID_FIELD_LAYOUT = "invalid_field_layout"
"""400: a field layout that is not batched/flat/shared, or is malformed."""
INVALID_TENSOR_DATA = "invalid_tensor_data"
"""400: tensor data of the wrong form."""
NESTING_TOO_DEEP = "nesting_too_deep"
"""400: nested lists deeper than the limit."""
UNSUPPORTED_WIRE_TRANSFORM = "unsupported_wire_transform"
"""400: a kwargs field declares a wire transform the receiver does not apply (a name it does
not know, or one this model's processor has not for that field)."""

UNSUPPORTED_CONTENT_ENCODING = "unsupported_content_encoding"
"""415: a body sent with a ``Content-Encoding`` the receiver does not decode (it decodes
``zstd``, and says so in every answer's ``Accept-Encoding``)."""

# Render: media loading.
INVALID_MEDIA = "invalid_media"
"""400: a malformed media URL (the base of the media types below)."""
MEDIA_SCHEME_NOT_ALLOWED = "media_scheme_not_allowed"
"""400: the media URL's scheme is not allowed."""
MEDIA_URL_FORBIDDEN = "media_url_forbidden"
"""403: the media URL points at a forbidden host, domain or path."""
MEDIA_FETCH_FAILED = "media_fetch_failed"
"""422: fetching remote media failed (timeout, connection, non-2xx, redirects)."""
MEDIA_TOO_LARGE = "media_too_large"
"""413: the media's bytes exceed the size cap."""
MEDIA_NOT_FOUND = "media_not_found"
"""400: a local media file does not exist."""
INVALID_IMAGE = "invalid_image"
"""400: the bytes are not a decodable image."""
IMAGE_TOO_LARGE = "image_too_large"
"""413: the image has more pixels than allowed."""
INVALID_MM_EMBEDS = "invalid_mm_embeds"
"""400: an ``image_embeds`` content part whose tensors do not fit the model (names, dtype,
hidden size, rows against the grid, grid against the merge size)."""

# Generate.
MM_CACHE_MISS = "mm_cache_miss"
"""409: null ``kwargs_data`` for items this node does not hold; ``details.missing`` names them."""
INVALID_PLACEHOLDERS = "invalid_placeholders"
"""400: placeholder ranges that do not sit on the model's placeholder tokens."""
INVALID_MM_ITEM = "invalid_mm_item"
"""400: a kwargs item this model's processor does not produce."""
INVALID_SAMPLING_PARAMS = "invalid_sampling_params"
"""400: a sampling field that is unknown, not allowed here, or out of range."""
STRUCTURED_OUTPUTS_DISABLED = "structured_outputs_disabled"
"""400: ``sampling_params.structured_outputs`` sent to a server started with
``--disable-structured-outputs``."""
STRUCTURED_OUTPUT_TOO_LARGE = "structured_output_too_large"
"""400: ``sampling_params.structured_outputs`` (schema, regex, grammar, choices...) is larger,
serialized as JSON, than the server's ``--max-structured-output-bytes``."""
INVALID_STRUCTURED_OUTPUT = "invalid_structured_output"
"""400: a JSON schema, regex, grammar, choice list or structural tag that vLLM's structured-output
backend cannot turn into a grammar (malformed, unsupported, too deep, or matching nothing)."""
ENGINE_NOT_READY = "engine_not_ready"
"""503: the engine is starting or has failed."""

# Generate: control routes and weight updates.
CONTROL_ROUTES_DISABLED = "control_routes_disabled"
"""403: a state-changing control route on a server with no API key and no
``--enable-control-routes``."""
ADMIN_REQUIRED = "admin_required"
"""403: a state-changing control route (pause, resume, abort, weight updates, cache reset)
called with an inference key where it needs an admin key (``--admin-api-key``); nothing was
done."""
INVALID_WEIGHT_UPDATE = "invalid_weight_update"
"""400: an update whose tensors the model does not have, or with the wrong shape or dtype, or
layers sent in part, or a file that is not safetensors; nothing was loaded."""
WEIGHT_PATH_NOT_ALLOWED = "weight_path_not_allowed"
"""400: an update path outside the server's weight-transfer folder (or no folder is set)."""
WEIGHT_UPDATE_CONFLICT = "weight_update_conflict"
"""409: a weight-update call out of order (update or finish with no update started, a start
while one is under way)."""
WEIGHT_UPDATE_SEQ_SEEN = "weight_update_seq_seen"
"""409: a start whose update id (``X-Tandem-Update-Id``) has a SEQ the node has already seen
start: two routers minted the same SEQ (one counted from a stale view of the fleet), so the
fleet's updates would no longer be ordered. Nothing started; ``details.seen_seq`` is the
highest SEQ the node has seen, for the router to mint above it."""
WEIGHT_UPDATE_INCOMPLETE = "weight_update_incomplete"
"""409: a finish whose caller sent other chunks of the update than the node took (its
``X-Tandem-Update-Received`` differs from the node's own receipt: a chunk was lost on the way);
the node ended the update without loading it."""
WEIGHT_TRANSFER_NOT_CONFIGURED = "weight_transfer_not_configured"
"""409: weight-transfer calls on a server started without ``--weight-transfer-config``."""
WEIGHT_CHECKPOINT_UNAVAILABLE = "weight_checkpoint_unavailable"
"""409: the node cannot read the served model's own safetensors checkpoint, against which every
update is checked (not in its local files, or a header it cannot read); nothing was loaded."""
PREFIX_CACHE_NOT_RESET = "prefix_cache_not_reset"
"""503: the new weights are loaded and labelled, but the engine's prefix cache could not be
reset, so KV computed with the old weights may still be reused; retry ``/reset_prefix_cache``."""
# Front door.
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
"""503: no node of a tier could be reached (or none is healthy); the message names the tier.
Generate answers it too when the render node that resolves ``content_parts`` cannot be reached,
times out or is not ready."""
CONTROL_PARTIAL_FAILURE = "control_partial_failure"
"""502: a control route fanned out to every generate node failed on some; ``details.failed``
names each failed node with its status and error type, ``details.succeeded`` the others."""
UPSTREAM_ERROR = "upstream_error"
"""502: an upstream answered something the front door cannot read (not a typed error), or its
connection broke (reset, protocol error) before or during the answer. Generate answers it when
the render node that resolves ``content_parts`` fails or refuses generate's own key."""
UPSTREAM_TIMEOUT = "upstream_timeout"
"""504: an upstream took the request but did not answer (or send more of its answer) within the
front door's read timeout."""
