"""How an S3 failure becomes a RemoteStorageError: retriable or not, naming the setting.

A broker started with a wrong bucket, key or endpoint should say which setting is wrong
at start, not log "403" for ever; a store that is only slow or briefly away should be
tried again. The S3 error code (not the HTTP status alone) tells these apart.
"""

from __future__ import annotations

import aiohttp
import botocore.exceptions as bce

from logmq.storage.remote.store import RemoteObjectNotFound, RemoteStorageError

BUCKET_SETTING = "rsm.config.storage.s3.bucket.name"
ENDPOINT_SETTING = "rsm.config.storage.s3.endpoint.url"
REGION_SETTING = "rsm.config.storage.s3.region"
ACCESS_KEY_SETTING = "rsm.config.storage.aws.access.key.id"
SECRET_KEY_SETTING = "rsm.config.storage.aws.secret.access.key"
PART_SIZE_SETTING = "rsm.config.storage.s3.multipart.upload.part.size"
TIMEOUT_SETTING = "rsm.config.storage.s3.api.call.attempt.timeout"

# S3 error codes worth another attempt (besides any 5xx and 429)
_RETRIABLE_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RequestLimitExceeded",
        "OperationAborted",
        "ExpiredToken",  # a credential chain refreshes temporary credentials
    }
)
_NETWORK_ERRORS = (
    bce.EndpointConnectionError,
    bce.ConnectTimeoutError,
    bce.ReadTimeoutError,
    bce.ConnectionClosedError,
    bce.HTTPClientError,
    aiohttp.ClientError,
    TimeoutError,
    OSError,
)


def _setting_hint(code: str, status: int, bucket: str) -> tuple[str, bool] | None:
    """(what is wrong, retriable) for the codes that point at one setting."""
    if code == "NoSuchBucket":
        return f"the bucket {bucket!r} does not exist ({BUCKET_SETTING})", False
    if code == "InvalidBucketName":
        return f"{bucket!r} is not a valid bucket name ({BUCKET_SETTING})", False
    if code == "InvalidAccessKeyId":
        return f"the store does not know this access key id ({ACCESS_KEY_SETTING})", False
    if code == "SignatureDoesNotMatch":
        return f"the signature does not match: a wrong secret key ({SECRET_KEY_SETTING})", False
    if code in ("InvalidToken", "InvalidSecurity"):
        return (
            f"the credentials' session token is refused ({ACCESS_KEY_SETTING}, "
            f"{SECRET_KEY_SETTING} or the AWS credential chain)",
            False,
        )
    if code in ("AccessDenied", "AllAccessDisabled", "AccountProblem") or status == 403:
        return (
            f"access denied to bucket {bucket!r}: the credentials ({ACCESS_KEY_SETTING}) "
            "lack the permission, or the bucket's policy refuses it",
            False,
        )
    if code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraint"):
        return (
            f"the bucket {bucket!r} lives in another region or behind another endpoint "
            f"({REGION_SETTING}, {ENDPOINT_SETTING})",
            False,
        )
    if code == "RequestTimeTooSkewed":
        return "the broker's clock is too far from the store's (fix NTP)", True
    return None


def map_s3_error(
    exc: BaseException, *, what: str, attempts: int, bucket: str, endpoint_url: str | None
) -> RemoteStorageError:
    """The RemoteStorageError for ``exc`` raised while doing ``what``."""
    tried = f" (after {attempts} attempts)" if attempts > 1 else ""
    if isinstance(exc, RemoteStorageError):
        return exc
    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        text = f"{code or status}: {error.get('Message', '')}".rstrip(": ")
        if code in ("NoSuchKey", "NoSuchUpload"):
            return RemoteObjectNotFound(f"{what}: no such object ({text})")
        hint = _setting_hint(code, status, bucket)
        if hint is not None:
            return RemoteStorageError(f"{what}: {hint[0]}{tried} [{text}]", retriable=hint[1])
        retriable = status >= 500 or status == 429 or code in _RETRIABLE_CODES
        return RemoteStorageError(f"{what} failed{tried}: {text}", retriable=retriable)
    if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
        return RemoteStorageError(
            f"{what}: no AWS credentials: set {ACCESS_KEY_SETTING} and "
            f"{SECRET_KEY_SETTING}, or the AWS credential chain (env, profile, role)",
            retriable=False,
        )
    if isinstance(exc, bce.NoRegionError):
        return RemoteStorageError(f"{what}: no region: set {REGION_SETTING}", retriable=False)
    if isinstance(exc, ValueError | bce.ParamValidationError):
        return RemoteStorageError(
            f"{what}: bad request or endpoint {endpoint_url!r} ({ENDPOINT_SETTING}): {exc}",
            retriable=False,
        )
    if isinstance(exc, _NETWORK_ERRORS):
        timed_out = isinstance(exc, TimeoutError | bce.ReadTimeoutError | bce.ConnectTimeoutError)
        kind = "timed out" if timed_out else f"failed: {exc!r}"
        return RemoteStorageError(
            f"{what} {kind}{tried}: is the store at "
            f"{endpoint_url or 'AWS S3'} ({ENDPOINT_SETTING}) reachable?"
        )
    return RemoteStorageError(f"{what} failed{tried}: {exc!r}")
