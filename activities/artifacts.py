"""The artifact store: large outputs out of band, referenced by :class:`ArtifactRef`.

Content-addressed and scoped by tenant: the same bytes of one tenant are
stored once; a tenant reads only its own artifacts (asking for another
tenant's is ``access_denied``, whatever the URI says). :class:`ArtifactStore`
is the interface; :class:`FileArtifactStore` (``file://`` under
``<data_dir>/artifacts/<tenant>/<sha256[:2]>/<sha256>``) the default backend.
An S3-compatible backend implements the same two methods.

**A URI this store does not hold.** ``access_denied`` is for a URI inside this
store that is another tenant's; a URI outside it (another data directory,
another bucket) is not a question of tenancy: it is ``not_found`` naming the
store this process has and the setting that chooses it, never a tenancy error.
A client that reads a run's results (``aiworker items`` from another folder
than the dev stack's) may read such a ``file://`` artifact where it is
(:class:`FileArtifactStore` with ``elsewhere=True``), and only there: the path must
be ``…/artifacts/<the run's tenant>/<sha256[:2]>/<sha256>``, and the bytes must
hash to that name, so it reads only an artifact of that tenant whose address the
run's own result gave. A worker's store never does (``elsewhere`` is off): a
step's input could name any path.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, unquote, urlsplit

from aiworker.activities.errors import AccessDeniedError, InvalidInputError, NotFoundError
from aiworker.schemas.protocol import ArtifactRef

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ArtifactStore(Protocol):
    """Where artifacts live; every call names the tenant it acts for."""

    async def put(
        self, tenant: str, data: bytes, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        """Store ``data`` for ``tenant``; the same bytes give the same reference."""
        ...

    async def get(self, tenant: str, ref: ArtifactRef | str) -> bytes:
        """The bytes of ``ref``; ``access_denied`` if it is not ``tenant``'s."""
        ...


def tenant_dir(tenant: str) -> str:
    """A path segment for ``tenant`` that cannot escape its parent."""
    if not tenant or tenant in (".", ".."):
        raise InvalidInputError(f"tenant {tenant!r} cannot own artifacts", field="tenant")
    return quote(tenant, safe="")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except FileNotFoundError:  # the directory's first file: one mkdir, not one per write
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_file(path: Path, flags: int) -> int:
    """``os.open(path, flags)`` (close-on-exec, mode 0644), its directory made first
    when missing: one ``mkdir`` for a directory's first file, not one per write."""
    flags |= getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o644)


def write_once(path: Path, data: bytes) -> None:
    """Store ``data`` at a content-addressed ``path`` (its name is the hash of
    ``data``): created in place, once; a file there of another size (a write
    that died half way) is replaced whole.

    Why not :func:`atomic_write` for every artifact: a temporary file and a
    rename cost several times a plain create on an ext4 disk (the rename was
    0.1 to 1 ms of kernel time on the one the figures were taken on, a crawl
    pays it per page), and a content-addressed file needs no rename to be safe.
    A name holds only its own bytes, so a file of the right size is complete
    (its size grows as its bytes land), and a reader checks the hash anyway
    (:meth:`FileArtifactStore.get`). Two writers of the same bytes: the one that
    finds the file created by the other replaces it whole (:func:`atomic_write`),
    so neither returns before a complete file is there.
    """
    try:
        size: int | None = path.stat().st_size
    except FileNotFoundError:
        size = None
    if size == len(data):
        return  # stored already
    if size is None:
        try:
            fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            pass  # another writer is creating it: replace it whole below
        else:
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            return
    atomic_write(path, data)


class FileArtifactStore:
    """``file://`` artifacts, content-addressed under ``root/artifacts``.

    Args:
        root: the data directory (``settings.data_dir``).
        area: the directory under ``root`` (another area keeps its scopes apart
            from tenants', e.g. the SDK's external payloads).
    """

    def __init__(self, root: Path, *, area: str = "artifacts", elsewhere: bool = False) -> None:
        self.root = Path(root)
        self.area = area
        self.base = (Path(root) / area).resolve()
        self.elsewhere = elsewhere

    def path_for(self, tenant: str, sha256: str) -> Path:
        return self.base / tenant_dir(tenant) / sha256[:2] / sha256

    async def put(
        self, tenant: str, data: bytes, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_for(tenant, digest)
        write_once(path, data)
        return ArtifactRef(
            uri=path.as_uri(), sha256=digest, size_bytes=len(data), media_type=media_type
        )

    def _resolve(self, tenant: str, ref: ArtifactRef | str) -> tuple[Path, str]:
        uri = ref.uri if isinstance(ref, ArtifactRef) else ref
        parts = urlsplit(uri)
        if parts.scheme != "file":
            raise InvalidInputError(f"not a file:// artifact: {uri}", field="artifact")
        path = Path(unquote(parts.path)).resolve()
        own = self.base / tenant_dir(tenant)
        if path.is_relative_to(self.base) and not path.is_relative_to(own):
            raise AccessDeniedError(
                f"artifact {uri} does not belong to tenant {tenant!r}", uri=uri, tenant=tenant
            )
        digest = path.name
        if not _SHA256.match(digest) or path.parent.name != digest[:2]:
            raise InvalidInputError(f"not an artifact address: {uri}", field="artifact")
        if not path.is_relative_to(own):
            self._elsewhere(path, tenant, uri)
        return path, digest

    def _elsewhere(self, path: Path, tenant: str, uri: str) -> None:
        """Refuse an artifact address outside this store, unless it may be read where it is."""
        segment = path.parent.parent
        if segment.parent.name == self.area and segment.name != tenant_dir(tenant):
            raise AccessDeniedError(
                f"artifact {uri} is in tenant {unquote(segment.name)!r}'s folder of another "
                f"artifact store, not tenant {tenant!r}'s",
                uri=uri,
                tenant=tenant,
            )
        if self.elsewhere and segment.parent.name == self.area and path.is_file():
            return
        raise NotFoundError(
            f"artifact {uri} is not in this process's artifact store (the file store under "
            f"{self.base}, from AIWORKER_DATA_DIR={self.root}) and cannot be read where it "
            "is: run from the folder of the stack that wrote it, or set AIWORKER_DATA_DIR "
            "to its data directory (or AIWORKER_ARTIFACT_STORE to the S3 store it shares)",
            uri=uri,
        )

    async def get(self, tenant: str, ref: ArtifactRef | str) -> bytes:
        path, digest = self._resolve(tenant, ref)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise NotFoundError(f"artifact {path.name} not found", sha256=digest) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidInputError(f"artifact {digest} is corrupt", field="artifact")
        return data


__all__ = ["ArtifactStore", "FileArtifactStore", "tenant_dir"]
