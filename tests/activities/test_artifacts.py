"""Unit tests of the file artifact store: content addressing and tenant scoping."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiworker.activities.artifacts import FileArtifactStore
from aiworker.activities.errors import AccessDeniedError, InvalidInputError


async def test_artifacts_are_content_addressed_and_tenant_scoped(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    ref = await store.put("acme", b"<html>hi</html>", "text/html")
    again = await store.put("acme", b"<html>hi</html>", "text/html")
    assert ref == again and ref.size_bytes == 15 and ref.uri.startswith("file://")
    assert f"/artifacts/acme/{ref.sha256[:2]}/{ref.sha256}" in ref.uri
    assert await store.get("acme", ref) == b"<html>hi</html>"
    with pytest.raises(AccessDeniedError):
        await store.get("globex", ref)
    sneaky = ref.uri.replace("/acme/", "/globex/../acme/")
    with pytest.raises(AccessDeniedError):
        await store.get("globex", sneaky)
    weird = await store.put("../evil", b"x")
    assert f"/artifacts/..%252Fevil/{weird.sha256[:2]}/" in weird.uri
    assert await store.get("../evil", weird) == b"x"


async def test_an_artifact_is_written_in_place_once_and_a_torn_one_replaced(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    page = b"<html>" + b"x" * 5000 + b"</html>"
    ref = await store.put("acme", page, "text/html")
    path = store.path_for("acme", ref.sha256)
    assert sorted(p.name for p in path.parent.iterdir()) == [ref.sha256]  # no temporary file
    first = path.stat()
    await store.put("acme", page, "text/html")  # stored already: left as it is
    assert path.stat().st_ino == first.st_ino and path.stat().st_mtime_ns == first.st_mtime_ns

    path.write_bytes(page[:100])  # a writer that died half way
    with pytest.raises(InvalidInputError, match="corrupt"):
        await store.get("acme", ref)  # a reader checks the hash
    await store.put("acme", page, "text/html")  # the next writer replaces it whole
    assert await store.get("acme", ref) == page
    assert sorted(p.name for p in path.parent.iterdir()) == [ref.sha256]
