"""The state-file threshold store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rabbitflow_broker.engine.flow import Thresholds
from rabbitflow_broker.server.persistence import FileThresholdStore, PersistenceError

T = Thresholds(stop_count=10, resume_count=5)


@pytest.mark.asyncio
async def test_saved_thresholds_load_in_a_new_store(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    await FileThresholdStore(path).save(("/", "q"), T)
    assert await FileThresholdStore(path).load() == {("/", "q"): T}


@pytest.mark.asyncio
async def test_saving_none_forgets(tmp_path: Path) -> None:
    store = FileThresholdStore(tmp_path / "state.json")
    await store.save(("/", "q"), T)
    await store.save(("/", "q"), None)
    assert await FileThresholdStore(tmp_path / "state.json").load() == {}


@pytest.mark.asyncio
async def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert await FileThresholdStore(tmp_path / "none.json").load() == {}


@pytest.mark.asyncio
async def test_corrupt_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(PersistenceError, match=r"state\.json"):
        await FileThresholdStore(path).load()
