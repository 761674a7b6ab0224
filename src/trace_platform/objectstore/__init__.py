"""Object stores: one narrow protocol, a `local` directory adapter (Lite default) and an `s3`
adapter (AWS S3, MinIO, any S3-compatible endpoint). Keys are '/'-separated and relative:
`org/{org_id}/dataset/{dataset_uuid}/version/{dataset_version}/…`."""

from __future__ import annotations

from pathlib import Path

from trace_platform.config import ObjectStoreBackend, Settings
from trace_platform.objectstore.protocol import (
    NoSuchKey,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    Page,
    check_key,
    delete_prefix,
    list_all,
)

# The package is the adapters' public face: callers import the protocol from here.
__all__ = [
    "NoSuchKey",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "Page",
    "check_key",
    "delete_prefix",
    "list_all",
    "make_store",
    "store_env",
]


def store_env(settings: Settings) -> dict[str, str]:
    """The object-store settings a worker hands to the operators it runs (and nothing else)."""
    env = {
        "TRACE_OBJECT_STORE": settings.object_store.value,
        "TRACE_SPARK_MASTER": settings.spark_master,
    }
    if settings.object_store is ObjectStoreBackend.local:
        assert settings.object_store_root is not None
        env["TRACE_OBJECT_STORE_ROOT"] = str(Path(settings.object_store_root).absolute())
    else:
        env["TRACE_S3_BUCKET"] = settings.s3_bucket
        env["TRACE_S3_REGION"] = settings.s3_region
        if settings.s3_endpoint_url:
            env["TRACE_S3_ENDPOINT_URL"] = settings.s3_endpoint_url
        if settings.s3_access_key_id:
            env["TRACE_S3_ACCESS_KEY_ID"] = settings.s3_access_key_id
        if settings.s3_secret_access_key:
            env["TRACE_S3_SECRET_ACCESS_KEY"] = settings.s3_secret_access_key.get_secret_value()
    return env


def make_store(settings: Settings) -> ObjectStore:
    if settings.object_store is ObjectStoreBackend.s3:
        from trace_platform.objectstore.s3 import S3Store

        return S3Store(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            access_key_id=settings.s3_access_key_id,
            secret_access_key=(
                settings.s3_secret_access_key.get_secret_value()
                if settings.s3_secret_access_key
                else None
            ),
        )
    from trace_platform.objectstore.local import LocalStore

    assert settings.object_store_root is not None
    return LocalStore(settings.object_store_root)
