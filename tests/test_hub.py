"""Fail-fast Hub loading (`cory.hub`): unreachable Hub names raise `AssetUnavailableError` within seconds.

Covers offline mode (env variables), an unreachable Hub without offline mode (probe patched to fail, and a real
endpoint that accepts connections but never answers), local folders passing straight through, missing local paths,
and the one-paragraph message naming the asset and the fix.
Run: `pytest -q tests/test_hub.py`.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers.runners import REPO, cli, env, one_error_line
from transformers import AutoTokenizer

from cory import hub
from cory.errors import AssetUnavailableError
from cory.hub import from_pretrained_or_fail, load_dataset_or_fail
from cory.models import byte_tokenizer, load_pretrained
from cory.tasks.rewards import ClassifierReward

OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in OFFLINE:
        monkeypatch.setenv(var, "1")


def _assert_fast_failure(call, name: str) -> str:
    start = time.perf_counter()
    with pytest.raises(AssetUnavailableError) as info:
        call()
    assert time.perf_counter() - start < 10.0
    message = str(info.value)
    assert name in message and "local" in message and "\n" not in message
    return message


def test_missing_models_fail_fast_offline() -> None:
    message = _assert_fast_failure(lambda: load_pretrained("gpt2-definitely-missing"), "gpt2-definitely-missing")
    assert "model.name_or_path=/path/to/local/folder" in message and "HF_HUB_OFFLINE" in message
    message = _assert_fast_failure(lambda: ClassifierReward("some-org/not-a-model"), "some-org/not-a-model")
    assert "task.reward.name_or_path" in message and "huggingface-cli download some-org/not-a-model" in message


def test_missing_dataset_fails_fast_offline() -> None:
    message = _assert_fast_failure(lambda: load_dataset_or_fail("imdb", key="task.source", split="train"), "'imdb'")
    assert "point task.source at local data" in message and "--repo-type dataset" in message


def test_unreachable_hub_without_offline_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in OFFLINE:
        monkeypatch.delenv(var)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=3.0: False)

    def loader(name: str, **kwargs: object) -> None:
        raise AssertionError("the loader must not be called when the Hub is unreachable")

    message = _assert_fast_failure(
        lambda: from_pretrained_or_fail(loader, "org/model", what="model", key="model.name_or_path"), "org/model"
    )
    assert "unreachable" in message
    _assert_fast_failure(lambda: load_dataset_or_fail("imdb", key="task.source"), "imdb")


def test_loader_errors_are_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in OFFLINE:
        monkeypatch.delenv(var)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=3.0: True)

    def loader(name: str, **kwargs: object) -> None:
        raise OSError("404 Client Error")

    with pytest.raises(AssetUnavailableError, match="org/model") as info:
        from_pretrained_or_fail(loader, "org/model", what="model", key="model.name_or_path")
    assert isinstance(info.value.__cause__, OSError) and "404 Client Error" in str(info.value)


def test_local_folder_goes_straight_through(tmp_path: Path) -> None:
    byte_tokenizer().save_pretrained(tmp_path / "tok")
    tokenizer = from_pretrained_or_fail(AutoTokenizer.from_pretrained, str(tmp_path / "tok"), what="model", key="k")
    assert tokenizer.decode(tokenizer("hello").input_ids) == "hello"
    missing = str(tmp_path / "nope")
    message = _assert_fast_failure(lambda: load_pretrained(missing), missing)
    assert "no such local folder" in message


def test_local_dataset_files_go_straight_through(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("text,label\ngood,1\nbad,0\n")
    rows = load_dataset_or_fail("csv", key="task.data_files", data_files=str(path), split="train")
    assert rows["label"] == [1, 0]


def test_an_endpoint_that_accepts_but_never_answers_fails_in_seconds_in_one_line(tmp_path: Path) -> None:
    """An endpoint (or proxy) that accepts TCP but never answers TLS or HTTP: `model=gpt2` without the offline
    variables waited for minutes on the loaders' retries; it fails in one line within seconds, naming the endpoint
    it tried (with its port) and how to use a local copy, and leaves no run folder."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # the kernel completes each connection; nothing ever reads or answers
    port = server.getsockname()[1]
    online = {k: v for k, v in env().items() if k not in OFFLINE}
    online |= {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf")}
    run_dir = tmp_path / "run"
    args = ["experiment=smoke", "model=gpt2", "progress=false", f"hydra.run.dir={run_dir}"]
    start = time.monotonic()
    try:
        out = subprocess.run(cli(*args), cwd=REPO, env=online, capture_output=True, text=True, timeout=150)
    finally:
        server.close()
    elapsed = time.monotonic() - start
    line = one_error_line(out)
    assert elapsed < 60, elapsed  # the probe waits 5 s at most per phase; the rest is the interpreter's start
    assert f"the Hub at 127.0.0.1:{port} (set by HF_ENDPOINT) is unreachable" in line
    assert "'gpt2'" in line and "model.name_or_path=/path/to/local/folder" in line
    assert not run_dir.exists()
