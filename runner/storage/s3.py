"""A store over an S3-compatible bucket: AWS S3, MinIO, Cloudflare R2, Backblaze B2,
DigitalOcean Spaces, rclone's ``serve s3``...

* Credentials come from the standard AWS chain (env, profile, instance role); none are
  ever put in a message.
* botocore retries throttling, 5xx and connection errors (``standard`` mode: exponential
  backoff with jitter) and every call has connect/read timeouts; whole-file transfers
  are retried a few more times on top (a multipart upload whose server restarted loses
  its parts: the only cure is to start that file again).
* Big files go through s3transfer's TransferManager: parallel multipart uploads and
  parallel ranged downloads.

Verifying an upload: S3's ETag is the MD5 of the object for a single PUT, and
``md5(md5(part 1) + ... + md5(part n)) + "-n"`` for a multipart upload (AWS, MinIO,
moto); some servers (rclone) report the whole-object MD5 either way. We hash the local
file once (per-part MD5s with the part size s3transfer will use, the whole MD5 and the
sha256) and accept either form after a HEAD whose size must match. When the ETag is
neither (SSE-KMS/SSE-C objects, servers with opaque ETags) we read the object back and
compare its sha256: slower, never wrong. The checkpoint manifest's sha256 is the
end-to-end check again on download.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.utils import ChunksizeAdjuster
from urllib3.exceptions import HTTPError as Urllib3Error

from runner.storage.base import (
    JOB_SETTINGS,
    ObjectInfo,
    SettingNames,
    StorageError,
    Store,
    check_key,
    check_prefix,
)

MiB = 1 << 20
_AUTH = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
         "InvalidToken", "TokenRefreshRequired", "InvalidClientTokenId", "Forbidden", "403",
         "UnrecognizedClientException", "InvalidSecurity"}
_REGION = {"AuthorizationHeaderMalformed", "PermanentRedirect", "301",
           "IllegalLocationConstraintException"}
_CONFLICT = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_TRANSIENT = {"NoSuchUpload", "RequestTimeout", "SlowDown", "ServiceUnavailable",
              "InternalError", "InternalServerError", "503", "500", "502", "504"}
CHECK_ATTEMPTS = 3  # the opening check's tries (the store's own calls get max_attempts)
# A connection that failed, or a response that broke off: a body cut short
# (IncompleteRead), a reset while botocore reads an error body (urllib3's ProtocolError,
# which escapes botocore's own classes).
_CONNECTION = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError,
               ConnectionClosedError, ResponseStreamingError, IncompleteReadError,
               Urllib3Error)


_LOADER: Any = None  # botocore's service models, parsed once per process


def _session() -> Any:
    """A new botocore session (its own credentials, resolved from the environment as it
    is now) that reuses the process's parsed service models: a fresh session re-reads
    them, ~0.15 s on every store opened."""
    global _LOADER
    import botocore.session

    session = botocore.session.get_session()
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)
    return session


def credentials_here() -> bool:
    """Whether boto3 finds S3 credentials on this machine without asking the network:
    the environment, ``AWS_PROFILE`` and the shared files, SSO, a credential process. An
    instance or container role is not looked up: it exists only on its machine, and
    asking for it anywhere else waits for a timeout."""
    import botocore.session

    resolver = botocore.session.get_session().get_component("credential_provider")
    for remote in ("container-role", "iam-role"):
        resolver.remove(remote)
    try:
        return resolver.load_credentials() is not None
    except BotoCoreError:  # a profile named but broken: no usable credentials either
        return False


def _safe_endpoint(endpoint_url: str | None) -> str | None:
    """The endpoint without any user:password@ part."""
    if not endpoint_url:
        return None
    parts = urlsplit(endpoint_url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code") or
               e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _transient(e: BaseException) -> bool:
    if isinstance(e, _CONNECTION):
        return True
    return isinstance(e, ClientError) and (_code(e) in _TRANSIENT or _status(e) >= 500)


def file_digests(path: Path, part_size: int, whole_md5: bool = True,
                 part_md5s: bool = True) -> tuple[str | None, str | None, str, int]:
    """(whole-file MD5, multipart ETag for ``part_size``, sha256, size) in one read; an
    MD5 that is not wanted is skipped (None): each costs a full pass of MD5 over the file."""
    whole, sha, parts, size = hashlib.md5(), hashlib.sha256(), [], 0
    with open(path, "rb") as f:
        while block := f.read(part_size):
            if whole_md5:
                whole.update(block)
            if part_md5s:
                parts.append(hashlib.md5(block).digest())
            sha.update(block)
            size += len(block)
    multipart = (f"{hashlib.md5(b''.join(parts)).hexdigest()}-{max(1, len(parts))}"
                 if part_md5s else None)
    return whole.hexdigest() if whole_md5 else None, multipart, sha.hexdigest(), size


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, addressing_style: str | None = None,
                 max_attempts: int = 8, connect_timeout: float = 10.0,
                 read_timeout: float = 60.0, part_size: int = 16 * MiB,
                 multipart_threshold: int | None = None, max_concurrency: int = 8,
                 conditional_writes: bool | None = None, check: bool = True,
                 names: SettingNames = JOB_SETTINGS):
        try:  # a library user's S3Store gets the same protection as a job's storage.url
            self.bucket, self.prefix = bucket, check_prefix(prefix)
        except ValueError as e:
            raise StorageError(str(e)) from None
        self._multipart_etag: str | None = None  # "parts" or "whole", once seen
        self.names = names  # what an error calls the settings to fix
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        env_endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
            "AWS_ENDPOINT_URL")
        self.endpoint = _safe_endpoint(endpoint_url or env_endpoint) or "AWS S3"
        custom = bool(endpoint_url or env_endpoint)
        if addressing_style is None and custom:
            addressing_style = "path"  # MinIO & co; R2, B2 and Spaces accept it too
        options = dict(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            max_pool_connections=max(10, 4 * max_concurrency),  # files x parts in flight
            user_agent_extra="ten-runner",
        )
        if addressing_style:
            options["s3"] = {"addressing_style": addressing_style}
        if custom:
            # botocore >= 1.36 adds CRC checksums to every upload by default, which many
            # S3-compatible servers reject or mishandle; we verify ETag/sha256 ourselves.
            options["request_checksum_calculation"] = "when_required"
            options["response_checksum_validation"] = "when_required"
        session, config = _session(), Config(**options)
        try:
            self.client = session.create_client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config)
        except (BotoCoreError, ValueError) as e:
            raise StorageError(f"cannot configure S3 client for {self.url}: "
                               f"{type(e).__name__}; check {names.endpoint_url} and "
                               f"{names.region}") from None
        self.part_size = max(5 * MiB, part_size)
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold or self.part_size,
            multipart_chunksize=self.part_size, max_request_concurrency=max_concurrency)
        self._conditional = conditional_writes
        if check:
            # The opening check answers fast: with the full retries a mistyped endpoint took
            # a minute of backoff to report. A real outage at start is still retried, by
            # the relaunch that ExitCode.STORAGE asks for.
            quick = Config(retries={"max_attempts": min(max_attempts, CHECK_ATTEMPTS),
                                    "mode": "standard"})
            probe = session.create_client("s3", endpoint_url=endpoint_url,
                                          region_name=region, config=config.merge(quick))
            self._call("list", "", lambda: probe.list_objects_v2(
                Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else "", MaxKeys=1))

    # -- helpers -----------------------------------------------------------------------
    def _full(self, key: str) -> str:
        check_key(key)
        if not self.prefix:
            return key
        return f"{self.prefix}/{key}"

    def _where(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def _error(self, e: BaseException, op: str, key: str) -> StorageError:
        where = self._where(key)
        if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
            msg = (f"no usable S3 credentials for {self.url}: set AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or use an instance role)")
        elif isinstance(e, _CONNECTION):
            msg = (f"cannot reach endpoint {self.endpoint} ({type(e).__name__} during {op} "
                   f"{where}); check {self.names.endpoint_url} and the network")
        elif isinstance(e, ClientError):
            code, status = _code(e), _status(e)
            if code in _AUTH:
                msg = (f"access denied to {where} ({code}): check AWS_ACCESS_KEY_ID/"
                       "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket's policy")
            elif code == "NoSuchBucket":
                msg = (f"bucket '{self.bucket}' does not exist at {self.endpoint}; create it "
                       f"or fix {self.names.url} / {self.names.endpoint_url}")
            elif code in _REGION:
                msg = (f"bucket '{self.bucket}' is in another region ({code}); "
                       f"set {self.names.region}")
            else:
                text = str(e.response.get("Error", {}).get("Message") or "")[:200]
                msg = f"{op} {where} failed: {code} (HTTP {status}) {text}".rstrip()
                if status >= 500 or code in _TRANSIENT:
                    msg += " — the server kept failing after retries; try again later"
        else:
            msg = f"{op} {where} failed: {type(e).__name__}: {e}"
        for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):  # belt and braces
            secret = os.environ.get(name)
            if secret and len(secret) >= 4:
                msg = msg.replace(secret, "***")
        return StorageError(msg)

    def _call(self, op: str, key: str, fn, attempts: int = 1):
        """Run ``fn`` mapping errors to StorageError; whole-operation retries on top of
        botocore's for transient failures when ``attempts`` > 1."""
        for attempt in range(attempts):
            try:
                return fn()
            except (BotoCoreError, ClientError, Urllib3Error) as e:
                if attempt + 1 < attempts and _transient(e):
                    time.sleep(min(8.0, 0.5 * 2 ** attempt) * random.uniform(0.5, 1.5))
                    continue
                raise self._error(e, op, key) from None

    # -- the interface -----------------------------------------------------------------
    @property
    def conditional_writes(self) -> bool:
        if self._conditional is None:
            self._conditional = self._probe_conditional()
        return self._conditional

    def _probe_conditional(self) -> bool:
        """Does the server honour If-None-Match: * ? (rclone, old MinIO do not.)"""
        key = f".ten-probe/{uuid.uuid4().hex}"
        full = self._full(key)
        try:
            self._call("put", key, lambda: self.client.put_object(
                Bucket=self.bucket, Key=full, Body=b"1", IfNoneMatch="*"))
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=b"2", IfNoneMatch="*")
                return False  # the second conditional write succeeded: ignored
            except ClientError as e:
                return _code(e) in _CONFLICT
        except StorageError:
            return False
        finally:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=full)
            except (BotoCoreError, ClientError):
                pass

    def put_file(self, key: str, local_path: Path, sha256: str | None = None) -> ObjectInfo:
        """Upload, hashing the file in a second thread while it is sent (hashlib releases
        the GIL), then check the stored object against those hashes. Hashing first would
        add a whole extra read of the file to every upload."""
        local_path = Path(local_path)
        try:
            size = local_path.stat().st_size
        except OSError as e:
            raise StorageError(f"cannot read {local_path}: {e.strerror or e}") from None
        part = ChunksizeAdjuster().adjust_chunksize(self.part_size, size)
        full = self._full(key)
        # A single PUT's ETag is the file's MD5. For multipart uploads S3, MinIO and moto
        # return an MD5 of the part MD5s, some servers (rclone) the whole file's MD5:
        # once a multipart ETag has shown which, only that one is computed.
        multi = size >= self.transfer.multipart_threshold
        style = self._multipart_etag if multi else "whole"
        with ThreadPoolExecutor(1) as pool:
            digests = pool.submit(file_digests, local_path, part, style != "parts",
                                  multi and style != "whole")

            def upload():
                with TransferManager(self.client, self.transfer) as tm:
                    tm.upload(str(local_path), self.bucket, full).result()

            self._call("upload", key, upload, attempts=3)
            try:
                md5, multipart, sha, hashed = digests.result()
            except OSError as e:
                raise StorageError(f"cannot read {local_path}: {e.strerror or e}") from None
        if hashed != size or (sha256 is not None and sha != sha256):
            self.delete([key])  # not committed anywhere yet: no manifest names it
            raise StorageError(f"local file {local_path} does not match its expected "
                               "sha256 (changed or corrupt); not uploading it")
        info = self.head(key)
        if info is None or info.size != size:
            got = "nothing" if info is None else f"{info.size} bytes"
            raise StorageError(f"upload of {self._where(key)} stored {got}, expected {size} "
                               "bytes")
        if multi and info.etag and self._multipart_etag is None:
            self._multipart_etag = ("parts" if info.etag == multipart
                                    else "whole" if info.etag == md5 else None)
        if info.etag not in {md5, multipart} - {None} and self._remote_sha256(key) != sha:
            raise StorageError(f"upload of {self._where(key)} does not match the local file "
                               "(sha256 differs); it will be uploaded again next time")
        return info

    def _remote_sha256(self, key: str) -> str:
        def read():
            h = hashlib.sha256()
            body = self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"]
            for block in body.iter_chunks(MiB):
                h.update(block)
            return h.hexdigest()
        return self._call("read", key, read, attempts=3)

    def get_file(self, key: str, local_path: Path) -> None:
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_path.with_name(f".tmp-{local_path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")

        def download():
            with TransferManager(self.client, self.transfer) as tm:
                tm.download(self.bucket, self._full(key), str(tmp)).result()

        try:
            self._call("download", key, download, attempts=3)
        except StorageError:
            tmp.unlink(missing_ok=True)
            if self.head(key) is None:
                raise StorageError(f"{self._where(key)} does not exist") from None
            raise
        os.replace(tmp, local_path)

    def put_bytes(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        full = self._full(key)
        if if_absent and not self.conditional_writes:
            # Check-then-put: racy, the best such a server allows (see Lease for the
            # read-back that detects a lost race).
            if self.head(key) is not None:
                return False
            if_absent = False
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        for attempt in range(3):
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **extra)
                return True
            except ClientError as e:
                if if_absent and _code(e) in _CONFLICT:
                    # After a retry the key may exist because our own first try landed.
                    return attempt > 0 and self.get_bytes(key) == data
                if attempt == 2 or not _transient(e):
                    raise self._error(e, "put", key) from None
            except BotoCoreError as e:
                if attempt == 2 or not _transient(e):
                    raise self._error(e, "put", key) from None
            time.sleep(min(8.0, 0.5 * 2 ** attempt) * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")

    def get_bytes(self, key: str) -> bytes | None:
        def read():
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self._full(key))[
                    "Body"].read()
            except ClientError as e:
                if _code(e) in ("NoSuchKey", "404"):
                    return None
                raise
        return self._call("read", key, read, attempts=3)

    def head(self, key: str) -> ObjectInfo | None:
        def head():
            try:
                r = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
            except ClientError as e:
                if _code(e) in ("NoSuchKey", "404", "NotFound"):
                    return None
                raise
            return ObjectInfo(int(r["ContentLength"]), (r.get("ETag") or "").strip('"') or None)
        return self._call("head", key, head, attempts=3)

    def list(self, prefix: str = "") -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        full = base + prefix

        def listing():
            keys = []
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=full):
                keys += [o["Key"][len(base):] for o in page.get("Contents", [])]
            return sorted(keys)
        return self._call("list", prefix, listing, attempts=3)

    def delete(self, keys) -> None:
        keys = list(keys)
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self._full(k)} for k in keys[i:i + 1000]]
            r = self._call("delete", keys[i], lambda b=batch: self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": b, "Quiet": True}), attempts=3)
            errors = [e for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise StorageError(f"delete {self.url}/{first.get('Key')} failed: "
                                   f"{first.get('Code')} {first.get('Message', '')}")
