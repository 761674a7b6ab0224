"""S3 (and any S3-compatible endpoint such as MinIO) through boto3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from trace_platform.objectstore.protocol import (
    NoSuchKey,
    ObjectInfo,
    ObjectStoreError,
    Page,
    check_key,
)

MULTIPART_THRESHOLD = 64 * 1024 * 1024


def _missing(e: ClientError) -> bool:
    return e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


class S3Store:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        part_size: int = 16 * 1024 * 1024,
    ) -> None:
        self.bucket = bucket
        self.region = region
        self.endpoint_url = endpoint_url
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            # Path-style addressing: what MinIO and other S3-compatible servers expect.
            config=Config(
                s3={"addressing_style": "path"} if endpoint_url else {}, retries={"max_attempts": 5}
            ),
        )
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold, multipart_chunksize=part_size
        )

    def ensure_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as e:
            if not _missing(e):
                raise ObjectStoreError(f"bucket {self.bucket}: {e}") from None
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self.client.create_bucket(**kwargs)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=check_key(key), Body=data)

    def put_file(self, key: str, path: Path) -> None:
        self.client.upload_file(str(path), self.bucket, check_key(key), Config=self.transfer)

    def get(self, key: str) -> bytes:
        try:
            return bytes(
                self.client.get_object(Bucket=self.bucket, Key=check_key(key))["Body"].read()
            )
        except ClientError as e:
            if _missing(e):
                raise NoSuchKey(key) from None
            raise

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            obj = self.client.get_object(
                Bucket=self.bucket, Key=check_key(key), Range=f"bytes={start}-{end - 1}"
            )
            return bytes(obj["Body"].read())
        except ClientError as e:
            if _missing(e):
                raise NoSuchKey(key) from None
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise

    def get_file(self, key: str, path: Path) -> None:
        try:
            self.client.download_file(self.bucket, check_key(key), str(path), Config=self.transfer)
        except ClientError as e:
            if _missing(e):
                raise NoSuchKey(key) from None
            raise

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=check_key(key))
            return True
        except ClientError as e:
            if _missing(e):
                return False
            raise

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=check_key(key))

    def list_page(self, prefix: str, token: str | None = None, limit: int = 1000) -> Page:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": check_key(prefix, prefix=True),
            "MaxKeys": limit,
        }
        if token:
            kwargs["ContinuationToken"] = token
        resp = self.client.list_objects_v2(**kwargs)
        items = [
            ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"])
            for o in resp.get("Contents", [])
        ]
        return Page(items, resp.get("NextContinuationToken") if resp.get("IsTruncated") else None)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{check_key(key)}"
