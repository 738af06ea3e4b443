"""What a request the S3 proxy saw is, in the cost meter's words: (object key relative to the store, operation).
The test's own reading of S3's REST API, independent of botocore's operation names (tiered/tiering/objects/meter.py)."""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit


def request_op(method: str, path: str, bucket: str, prefix: str) -> tuple[str, str]:
    """(key, op) for a path-style request `method path` on `bucket`; key "" for bucket-wide requests."""
    parts = urlsplit(path)
    query = parse_qs(parts.query, keep_blank_values=True)
    key = unquote(parts.path).removeprefix(f"/{bucket}").removeprefix("/")
    key = key.removeprefix(prefix.strip("/") + "/") if prefix and key else key
    if method == "GET" and "list-type" in query:
        return "", "list"
    if method == "POST" and "delete" in query:
        return "", "delete"
    if "uploads" in query or (method in ("POST", "DELETE") and "uploadId" in query):
        return key, "multipart"
    if method == "PUT" and "partNumber" in query:
        return key, "part"
    return key, {"PUT": "put", "GET": "get", "HEAD": "head", "DELETE": "delete"}[method]
