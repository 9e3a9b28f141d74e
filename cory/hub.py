"""Fail-fast loading of Hugging Face Hub names.

Without network, `from_pretrained("gpt2")` retries for about 50 s and `load_dataset("imdb")` for about 25 s before
failing with a message that does not say what to do. Every Hub lookup in `cory` goes through this module instead:

1. an existing local folder (or, for datasets, local files) is passed straight to the loader; a folder that
   does not load (truncated weights, a broken config) is one `AssetUnavailableError` naming it;
2. a Hub name already in the local HF cache is loaded with `local_files_only=True` (no network at all);
3. otherwise, when offline mode is set or the Hub endpoint (`HF_ENDPOINT`, else huggingface.co) does not answer
   one HTTP request within 5 s, `AssetUnavailableError` is raised at once, with one paragraph naming the asset,
   what was tried and how to fix it. The probe is a whole request, so an endpoint that accepts connections but
   never answers (a stalled proxy, a firewall that drops TLS) fails in seconds too, never minutes of retries.

Errors raised by the loader itself for a Hub name (OSError, ConnectionError, ValueError) are re-raised as
`AssetUnavailableError` with the same paragraph, chained with `from`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from huggingface_hub import constants, try_to_load_from_cache
from safetensors import SafetensorError

from cory.errors import AssetUnavailableError

T = TypeVar("T")

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
# `datasets` builders that read local files given in `data_files=`; never Hub names.
_LOCAL_BUILDERS = {"csv", "json", "parquet", "text", "arrow", "pandas", "imagefolder", "audiofolder"}
_LOADER_ERRORS = (OSError, ConnectionError, ValueError)


def offline_mode() -> str | None:
    """The name of the first offline environment variable that is set to a true value, else None."""
    for var in _OFFLINE_VARS:
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return var
    return None


def _endpoint() -> str:
    """`host:port` of the Hub endpoint (`HF_ENDPOINT`, else huggingface.co), as it is contacted."""
    url = urlparse(constants.ENDPOINT)
    return f"{url.hostname or 'huggingface.co'}:{url.port or (80 if url.scheme == 'http' else 443)}"


@functools.cache
def hub_reachable(timeout_s: float = 5.0) -> bool:
    """Whether the Hub endpoint answers one HTTP request within `timeout_s` per phase; probed once per process.

    A whole request, not a TCP connection: an endpoint (or a proxy) that accepts connections but never completes
    the TLS handshake or never answers would otherwise let the loaders' own retries run for minutes. Any HTTP
    answer, an error status included, counts as reachable.
    """
    import httpx

    try:
        httpx.head(constants.ENDPOINT, timeout=timeout_s)
        return True
    except (httpx.HTTPError, OSError, ValueError):  # DNS, refused, timeouts (connect, TLS, read), a malformed URL
        return False


def _looks_local(name_or_path: str) -> bool:
    # A Hub id is "name" or "org/name"; anything path-like that is missing is a wrong local path, not a Hub name.
    return name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1 or os.path.exists(name_or_path)


def _in_hub_cache(repo_id: str, repo_type: str) -> bool:
    filenames = ("config.json", "tokenizer_config.json") if repo_type == "model" else ("README.md",)
    for filename in filenames:
        try:
            if isinstance(try_to_load_from_cache(repo_id, filename, repo_type=repo_type), str):
                return True
        except ValueError:  # not a valid repo id (e.g. spaces): certainly not cached
            return False
    return False


def _message(what: str, name: str, key: str, tried: str, hint: str = "") -> str:
    if what == "dataset":
        local = hint or f"point {key} at local data (a folder, or files read by the 'csv'/'json'/'parquet' builders)"
        fix = (
            f"{local}, or download it on a connected machine with "
            f"`huggingface-cli download {name} --repo-type dataset --local-dir DIR` and use the local copy"
        )
    else:
        fix = (
            f"set {key}=/path/to/local/folder (a folder with config.json, the tokenizer files and the weights, "
            f"as written by save_pretrained), or download it on a connected machine with "
            f"`huggingface-cli download {name} --local-dir DIR` and copy DIR here"
        )
    return f"Cannot load the {what} '{name}': {tried}. To fix it, {fix}."


def _unavailable_reason() -> str | None:
    """Why the Hub cannot be used right now (offline mode or no connection), or None when it can."""
    cache = f"it is not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if var := offline_mode():
        return f"there is no local folder of that name, {cache}, and the Hub was not tried because {var} is set"
    if not hub_reachable():
        return f"there is no local folder of that name, {cache}, and {_no_answer()}"
    return None


def _no_answer() -> str:
    set_by = " (set by HF_ENDPOINT)" if os.environ.get("HF_ENDPOINT") else ""
    return f"the Hub at {_endpoint()}{set_by} is unreachable (no answer within 5 s; set HF_HUB_OFFLINE=1 to skip it)"


def from_pretrained_or_fail(loader: Callable[..., T], name_or_path: str, *, what: str, key: str, **kwargs: Any) -> T:
    """Call `loader(name_or_path, **kwargs)` (a `from_pretrained`) without ever waiting on an unreachable Hub.

    Args:
        loader: e.g. `AutoTokenizer.from_pretrained` or `AutoModelForCausalLM.from_pretrained`.
        name_or_path: a local folder or a Hub repo id.
        what: the kind of asset, for the message ("model", "reward model", ...).
        key: the config key that sets `name_or_path`, named in the fix (e.g. "model.name_or_path").
        **kwargs: passed to `loader`.

    Raises:
        AssetUnavailableError: the folder is missing, or the Hub name is neither cached nor downloadable.
    """
    if os.path.isdir(os.path.expanduser(name_or_path)):
        folder = os.path.expanduser(name_or_path)
        try:
            return loader(folder, **kwargs)
        except (*_LOADER_ERRORS, KeyError, EOFError, SafetensorError) as err:  # a damaged or foreign folder
            first = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
            raise AssetUnavailableError(
                f"Cannot load the {what} from the local folder {folder} ({type(err).__name__}: {first}). If it "
                f"is a cache cory built (under cache_dir), delete it and the next run rebuilds it; otherwise check "
                f"that it is a complete folder written by save_pretrained ({key})."
            ) from err
    if _looks_local(name_or_path):
        raise AssetUnavailableError(
            _message(what, name_or_path, key, "it looks like a local path but no such local folder exists")
        )
    if _in_hub_cache(name_or_path, "model"):
        tried = "it is in the local Hugging Face cache, but loading it with local_files_only=True failed"
        kwargs = {**kwargs, "local_files_only": True}
    elif reason := _unavailable_reason():
        raise AssetUnavailableError(_message(what, name_or_path, key, reason))
    else:
        tried = "there is no local folder of that name and downloading it from the Hub failed"
    try:
        return loader(name_or_path, **kwargs)
    except _LOADER_ERRORS as err:
        raise AssetUnavailableError(
            _message(what, name_or_path, key, f"{tried} ({type(err).__name__}: {err})")
        ) from err


def load_dataset_or_fail(name: str, *args: Any, key: str, hint: str = "", **kwargs: Any) -> Any:
    """`datasets.load_dataset(name, *args, **kwargs)` that fails within seconds when the Hub cannot provide `name`.

    Local builders ("csv", "json", ...) and local files or folders go straight through. With an offline variable
    set, `datasets` itself answers from its cache in about 1 s, so it is still called then.

    Args:
        name: a Hub dataset id ("imdb"), a local builder name or a local path.
        key: the config key to change, named in the fix (e.g. "task.source").
        hint: a task-specific way to use local data instead, replacing the generic one in the message.
        *args, **kwargs: passed to `load_dataset` (a config name, split, data_files, ...).

    Raises:
        AssetUnavailableError: the dataset is neither local, cached nor downloadable.
    """
    from datasets import load_dataset

    if name in _LOCAL_BUILDERS or os.path.exists(os.path.expanduser(name)):
        return load_dataset(name, *args, **kwargs)
    if _looks_local(name):
        raise AssetUnavailableError(
            _message("dataset", name, key, "it looks like a local path but no such local file or folder exists", hint)
        )
    tried = "there are no local files of that name and the Hub did not provide it"
    if offline_mode() is None and not hub_reachable():
        # Without offline mode `datasets` would retry for ~25 s; a cached copy is only read in offline mode.
        datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE", Path(constants.HF_HOME) / "datasets"))
        raise AssetUnavailableError(
            _message(
                "dataset",
                name,
                key,
                f"there are no local files of that name and {_no_answer()} (to use a copy already in "
                f"{datasets_cache}, set HF_DATASETS_OFFLINE=1)",
                hint,
            )
        )
    try:
        return load_dataset(name, *args, **kwargs)
    except _LOADER_ERRORS as err:
        raise AssetUnavailableError(
            _message("dataset", name, key, f"{tried} ({type(err).__name__}: {err})", hint)
        ) from err
