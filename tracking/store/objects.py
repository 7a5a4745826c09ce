"""The store's storage seam: the few operations a store needs of the place that keeps its files, as keys and bytes.

- `put_new(key, data)`: create-only; False (and nothing written) when the key is already there. Content-named files
  (segments, packs) are written this way: an existing one holds the same bytes.
- `put_if(key, data, etag)`: compare-and-swap for a file that is updated (a catalog, a run manifest): written only
  when the stored object's tag is still `etag` (None: only when there is none yet); ConflictError otherwise.
- `get(key)`: (bytes, tag), or None when there is no such key.
- `list(prefix)`: {key: tag} of every key under a prefix.
- `delete(key)`: gone, whether it was there or not.

Two places keep them: `FolderObjects`, a folder (the store as it has always been kept: atomic rename, core/atomic.py),
and `S3Objects`, a bucket and prefix on any S3-compatible service, through boto3: PutObject with `If-None-Match: *`
gives create-only, with `If-Match: <etag>` compare-and-swap, so no write depends on a rename that S3 does not have.
Endpoint and credentials come from the standard AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION / AWS_DEFAULT_REGION) and are never part of a message: an error names the URL and
the endpoint only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

S3_SCHEME = "s3://"
# a dead endpoint fails in seconds, not after botocore's default minute of retries
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
ATTEMPTS = 2
# what S3-compatible services answer to a PutObject whose If-None-Match / If-Match condition does not hold
CONDITION_FAILED = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
WRITE_CHECK = ".ragledger-write-check"  # the key a write permission is asked on; never written (S3Objects.check_writable)


class StorageError(ValueError):
    """The object store cannot be used as given (unreachable, no such bucket, refused credentials): one line."""


class ConflictError(StorageError):
    """A compare-and-swap lost: the object changed (or appeared) since it was read."""


class Objects(Protocol):
    def put_new(self, key: str, data: bytes) -> bool: ...

    def put_if(self, key: str, data: bytes, etag: str | None) -> str: ...

    def get(self, key: str) -> tuple[bytes, str] | None: ...

    def list(self, prefix: str = "") -> dict[str, str]: ...

    def delete(self, key: str) -> None: ...


def content_tag(data: bytes) -> str:
    """A folder's tag for a file: the MD5 of its bytes, as S3 tags an object written in one part."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class FolderObjects:
    """Keys as files under a folder; writes by an atomic rename (core/atomic.py). Create-only and compare-and-swap are
    exact for one writer per key at a time, which is what a folder store has always promised (its compaction holds an
    flock: tracking/store/compaction.py)."""

    root: Path

    def _path(self, key: str) -> Path:
        return self.root / key

    def put_new(self, key: str, data: bytes) -> bool:
        from core.atomic import atomic_write_bytes

        if self._path(key).exists():
            return False
        atomic_write_bytes(self._path(key), data)
        return True

    def put_if(self, key: str, data: bytes, etag: str | None) -> str:
        from core.atomic import atomic_write_bytes

        held = self.get(key)
        if (held[1] if held else None) != etag:
            raise ConflictError(f"{self._path(key)}: changed by another writer since it was read")
        atomic_write_bytes(self._path(key), data)
        return content_tag(data)

    def get(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return data, content_tag(data)

    def list(self, prefix: str = "") -> dict[str, str]:
        base = self.root / prefix if prefix else self.root
        if not base.is_dir():
            return {}
        return {p.relative_to(self.root).as_posix(): content_tag(p.read_bytes())
                for p in sorted(base.rglob("*")) if p.is_file() and not p.name.startswith(".tmp-")}

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # without a trailing slash; "" for the bucket's top

    @property
    def url(self) -> str:
        return f"{S3_SCHEME}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")


def is_s3_url(location: str | os.PathLike[str]) -> bool:
    return os.fspath(location).startswith(S3_SCHEME)


def parse_s3_url(text: str, what: str = "--store") -> S3Location:
    """`s3://bucket/prefix` as bucket and prefix; StorageError for a URL with no bucket or with credentials in it."""
    rest = text[len(S3_SCHEME):]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise StorageError(f"{what} s3://...: credentials or a port do not belong in the URL; set AWS_ACCESS_KEY_ID, "
                           "AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL")
    if not bucket:
        raise StorageError(f"{what} {text}: no bucket (s3://BUCKET/PREFIX)")
    return S3Location(bucket, prefix.strip("/"))


def endpoint() -> str | None:
    """The S3 endpoint the AWS variables name (None: AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


@dataclass
class S3Objects:
    """Keys as objects under `s3://bucket/prefix/` (see the module doc)."""

    location: S3Location
    what: str = "--store"
    _client: Any = field(default=None, repr=False)

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                            retries={"max_attempts": ATTEMPTS, "mode": "standard"}, region_name=region)
            self._client = boto3.session.Session().client("s3", endpoint_url=endpoint(), config=config)
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.location.prefix}/{key}" if self.location.prefix else key

    def _failed(self, exc: Exception, key: str = "") -> StorageError:
        """One line naming the URL and endpoint (never a credential) and what S3 said."""
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        where = f"{self.what} {self.location.url}" + (f" ({key})" if key else "")
        at = f" at {endpoint()}" if endpoint() else ""
        if isinstance(exc, NoCredentialsError):
            return StorageError(f"{where}: no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchBucket",):
                return StorageError(f"{where}: no bucket {self.location.bucket!r}{at}")
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "InvalidToken",
                        "ExpiredToken"):
                return StorageError(f"{where}: the S3 service{at} refused the credentials in AWS_ACCESS_KEY_ID / "
                                    f"AWS_SECRET_ACCESS_KEY ({code})")
            return StorageError(f"{where}: S3{at} answered {code or 'an error'}")
        if isinstance(exc, EndpointConnectionError) or type(exc).__name__ in (
                "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"):
            return StorageError(f"{where}: cannot reach the S3 endpoint {endpoint() or 'of AWS'} "
                                "(AWS_ENDPOINT_URL)")
        return StorageError(f"{where}: {type(exc).__name__}")

    def _call(self, key: str, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, method)(Bucket=self.location.bucket, **kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in CONDITION_FAILED:
                raise ConflictError(f"{self.location.url}/{key}: changed by another writer since it was read") from None
            if code in ("NoSuchKey", "404", "NotFound") and method in ("get_object", "head_object"):
                return None
            raise self._failed(exc, key) from None
        except BotoCoreError as exc:
            raise self._failed(exc, key) from None

    def check(self) -> None:
        """The bucket is there and the credentials are taken (one cheap request); StorageError otherwise."""
        self._call("", "list_objects_v2", Prefix=self._key(""), MaxKeys=1)

    def check_writable(self) -> None:
        """These credentials may write under the prefix, asked without writing anything: a PutObject conditional on a
        tag no object has (If-Match) is refused for want of the object (NoSuchKey, or 412) where writing is allowed,
        and with AccessDenied where it is not. StorageError (one line) for credentials that may only read, and for a
        service that ignores the condition (the store's compare-and-swap relies on it)."""
        from botocore.exceptions import BotoCoreError, ClientError

        where = f"{self.what} {self.location.url}"
        try:
            self.client.put_object(Bucket=self.location.bucket, Key=self._key(WRITE_CHECK), Body=b"",
                                   IfMatch='"ragledger-write-check"')
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", *CONDITION_FAILED):
                return
            if code in ("AccessDenied", "403"):
                raise StorageError(f"{where}: the credentials in AWS_ACCESS_KEY_ID may read this store but not write "
                                   "to it (AccessDenied); this command writes") from None
            raise self._failed(exc) from None
        except BotoCoreError as exc:
            raise self._failed(exc) from None
        self.delete(WRITE_CHECK)
        at = f" at {endpoint()}" if endpoint() else ""
        raise StorageError(f"{where}: the S3 service{at} ignored a conditional write (If-Match), which the store's "
                           "compare-and-swap needs")

    def put_new(self, key: str, data: bytes) -> bool:
        try:
            self._call(key, "put_object", Key=self._key(key), Body=data, IfNoneMatch="*")
        except ConflictError:
            return False
        return True

    def put_if(self, key: str, data: bytes, etag: str | None) -> str:
        condition = {"IfMatch": f'"{etag}"'} if etag else {"IfNoneMatch": "*"}
        answer = self._call(key, "put_object", Key=self._key(key), Body=data, **condition)
        return answer["ETag"].strip('"')

    def get(self, key: str) -> tuple[bytes, str] | None:
        answer = self._call(key, "get_object", Key=self._key(key))
        if answer is None:
            return None
        return answer["Body"].read(), answer["ETag"].strip('"')

    def list(self, prefix: str = "") -> dict[str, str]:
        return {key: obj["ETag"].strip('"') for key, obj in self._objects(prefix)}

    def modified(self, prefix: str = "") -> dict[str, float]:
        """Each object's last-modified time (epoch seconds, the service's clock) under `prefix`."""
        return {key: obj["LastModified"].timestamp() for key, obj in self._objects(prefix)}

    def _objects(self, prefix: str):
        full = self._key(prefix) if prefix else (f"{self.location.prefix}/" if self.location.prefix else "")
        token: dict[str, str] = {}
        while True:
            page = self._call(prefix, "list_objects_v2", Prefix=full, **token)
            for obj in page.get("Contents", []):
                yield (obj["Key"][len(self.location.prefix) + 1:] if self.location.prefix else obj["Key"]), obj
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def delete(self, key: str) -> None:
        self._call(key, "delete_object", Key=self._key(key))


def s3_objects(url: str, what: str = "--store") -> S3Objects:
    return S3Objects(parse_s3_url(url, what), what)
