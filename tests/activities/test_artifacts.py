"""Unit tests of the file artifact store: content addressing and tenant scoping."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiworker.activities.artifacts import FileArtifactStore
from aiworker.activities.errors import AccessDeniedError


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
