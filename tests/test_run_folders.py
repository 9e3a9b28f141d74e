"""Run folders a user did not expect, and a disk that fills up: one `error:` line naming the folder, exit code 2, and
nothing in the folder written or changed (cory/runs.py, `check_resume`; cory/checkpoints.py, `read_state`).

- A folder a resume could not use as it is: read-only (finished or not), a record that does not read back as a run
  writes it (`summary.json` corrupt, a list or a link; `starts.jsonl`, `run.lock`; `trainer.json` values of the wrong
  type or out of range), or a file where a run keeps a folder and the reverse. Each is refused by one check of the
  whole folder that runs before Hydra or the run writes anything there.
- `resume=` with no folder, and a new run's folder that is a file.
- A file-size limit (`ulimit -f`) reached while a checkpoint is written: one line naming the file (torch's writer
  does not say why it failed; the limit is asked for).

Each test snapshots the folder before and after. Run: `pytest tests/test_run_folders.py` (about two minutes).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.runners import cli, copy_of, env, finished_run, one_error_line, run_main, snapshot

from cory.checkpoints import latest_checkpoint


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """`finished_run`, once for the module: each test spoils a copy."""
    return finished_run(tmp_path_factory.mktemp("finished"))


def _kinds(folder: Path) -> dict[str, object]:
    """Every entry under `folder`: a file's bytes, else its kind and mode (links not followed)."""
    out: dict[str, object] = {}
    for top, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(top) / name
            kind = "link" if path.is_symlink() else "file" if path.is_file() else "dir" if path.is_dir() else "other"
            out[str(path.relative_to(folder))] = path.read_bytes() if kind == "file" else (kind, path.stat().st_mode)
    return out


def _refused(monkeypatch, capsys, run_dir: Path, *args: str) -> str:
    """`python -m cory.train resume=<run_dir> <args>` in-process: refused in one line, the folder as it was."""
    before = _kinds(run_dir)
    code, err = run_main(monkeypatch, capsys, f"resume={run_dir}", *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert _kinds(run_dir) == before
    return err


def _resign(path: Path, **values) -> None:
    """trainer.json with `values`, its digest recomputed (as an editor who knows the scheme would)."""
    rest = {k: v for k, v in json.loads(path.read_text()).items() if k != "state_sha256"} | values
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()
    path.write_text(json.dumps(rest | {"state_sha256": digest}))


TYPES = {  # a value of trainer.json → the key the refusal names
    "iteration a string": ({"iteration": "2"}, "iteration is '2', not a whole number >= 0"),
    "a line count a string": ({"metrics_lines": "4"}, "metrics_lines is '4', not a whole number >= 0"),
    "a line count negative": ({"samples_lines": -16}, "samples_lines is -16, not a whole number >= 0"),
    "the pending flag a string": ({"pending_eval": "no"}, "pending_eval is 'no', not true or false"),
    "run_info a list": ({"run_info": [1]}, "run_info is [1], not an object"),
    "the rng state empty": ({"rng": {}}, "rng is not a python and numpy generator state"),
    "the file list a list": ({"files": ["x"]}, "files is not an object of file names and their SHA-256"),
    "a file out of the checkpoint": (
        {"files": {"../../summary.json": "0" * 64}},
        "files is not an object of file names inside the checkpoint (it names '../../summary.json')",
    ),
    "the wall time a string": ({"wall_time_s": "x"}, "wall_time_s is 'x', not a finite number of seconds >= 0"),
    "the thread count zero": ({"torch_threads": 0}, "torch_threads is 0, not a whole number >= 1"),
    "another iteration than its folder": ({"iteration": 1, "nonfinite_iterations": 0}, "but the checkpoint folder is"),
}


@pytest.mark.parametrize("case", list(TYPES))
def test_trainer_json_values_of_the_wrong_type_are_one_line(finished, tmp_path, monkeypatch, capsys, case):
    run_dir = copy_of(finished, tmp_path)
    checkpoint = latest_checkpoint(run_dir)
    values, message = TYPES[case]
    _resign(checkpoint / "trainer.json", **values)
    err = _refused(monkeypatch, capsys, run_dir, "iterations=3")
    assert err.startswith(f"error: checkpoint {checkpoint} is unreadable (trainer.json: ") and message in err, err


def _summary(text: str):
    return lambda run_dir: (run_dir / "summary.json").write_text(text)


def _summary_link(run_dir: Path) -> None:
    target = run_dir.parent / "elsewhere.json"
    shutil.move(run_dir / "summary.json", target)
    (run_dir / "summary.json").symlink_to(target)


def _replace(name: str, by: str):
    def spoil(run_dir: Path) -> None:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        {"file": lambda: path.write_text("x"), "folder": path.mkdir, "pipe": lambda: os.mkfifo(path)}[by]()

    return spoil


SHAPES = {  # how a folder is spoilt → what the one line says after `resume=<folder>: `
    "summary.json not JSON": (_summary("{not json"), "summary.json is unreadable"),
    "summary.json a list": (_summary("[1, 2]"), "summary.json is not a run summary"),
    "summary.json completed a string": (_summary('{"completed": "yes"}'), "summary.json is not a run summary"),
    "summary.json a link": (_summary_link, "summary.json is a symbolic link"),
    "summary.json a folder": (
        _replace("summary.json", "folder"),
        "summary.json is a folder, where a run writes a file",
    ),
    "metrics.jsonl a pipe": (_replace("metrics.jsonl", "pipe"), "metrics.jsonl is neither a file nor a folder"),
    "metrics.jsonl not UTF-8": (
        lambda d: (d / "metrics.jsonl").write_bytes(b'{"iteration": 0}\n\xff\xfe\n'),
        "metrics.jsonl is not UTF-8 text",
    ),
    "train.log a folder": (_replace("train.log", "folder"), "train.log is a folder, where a run writes a file"),
    "checkpoints a file": (_replace("checkpoints", "file"), "checkpoints is a file, where a run keeps a folder"),
    ".hydra a file": (_replace(".hydra", "file"), ".hydra is a file, where a run keeps a folder"),
    "starts.jsonl a list": (lambda d: (d / "starts.jsonl").write_text("[1]\n"), "starts.jsonl line 1 is not a start"),
    "run.lock a list": (lambda d: (d / "run.lock").write_text("[1]"), "run.lock holds neither nothing nor a lock"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("extend", [False, True], ids=["finished", "extended"])
def test_a_run_folder_of_an_unexpected_shape_is_one_line_naming_it(
    finished, tmp_path, monkeypatch, capsys, shape, extend
):
    run_dir = copy_of(finished, tmp_path)
    spoil, message = SHAPES[shape]
    spoil(run_dir)
    err = _refused(monkeypatch, capsys, run_dir, *(["iterations=3"] if extend else []))
    assert err.startswith(f"error: resume={run_dir}: {message}") and "nothing in the run folder was changed" in err


def _chmod_all(folder: Path, change) -> None:
    for top, dirs, files in os.walk(folder, topdown=False):
        for name in [*(os.path.join(top, n) for n in [*dirs, *files]), top]:
            os.chmod(name, change(os.stat(name).st_mode))


def _read_only_command(tmp_path: Path, folder: Path, args: list[str]) -> list[str]:
    """`args` run with `folder` read-only: a read-only bind mount in a user namespace (root ignores file modes), else
    the folder's modes cleared (any other user); skipped where neither can be had."""
    probe = (
        subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
        if shutil.which("unshare")
        else None
    )
    if probe is not None and probe.returncode == 0:
        return ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder), *args]
    if os.geteuid() != 0:
        _chmod_all(folder, lambda mode: mode & ~0o222)
        return args
    pytest.skip("no way to make a folder read-only here (root, and no user namespaces)")


@pytest.mark.parametrize("extend", [False, True], ids=["finished", "not finished"])
def test_a_read_only_run_folder_is_refused_before_anything_is_written(finished, tmp_path, extend):
    run_dir = copy_of(finished, tmp_path)
    before = snapshot(run_dir)
    args = cli(f"resume={run_dir}", *(["iterations=3"] if extend else []))
    out = subprocess.run(
        _read_only_command(tmp_path, run_dir, args),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = one_error_line(out)
    assert line.startswith(f"error: resume={run_dir}: cannot write {run_dir}"), line
    assert "and a run writes into its folder" in line and "copy the folder elsewhere" in line
    _chmod_all(run_dir, lambda mode: mode | 0o200)  # undo the fallback's modes, if it was used
    assert snapshot(run_dir) == before


def test_resume_with_no_folder_is_refused_instead_of_starting_a_new_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where a new run would have gone (outputs/runs/...)
    code, err = run_main(monkeypatch, capsys, "experiment=smoke", "progress=false", "resume=")
    assert code == 2 and err == (
        "error: resume= names no run folder; pass resume=<run folder> (or leave resume out for a new run)\n"
    )
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("what", ["a file", "a link to a file", "a link to nothing"])
@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_a_run_folder_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys, key, what):
    afile, given = tmp_path / "afile", tmp_path / "given"
    afile.write_text("the user's\n")
    if what == "a file":
        shutil.copy(afile, given)
    else:
        given.symlink_to(afile if what == "a link to a file" else tmp_path / "nowhere" / "x")
    sweep = ["-m", "seed=0,1"] if key == "hydra.sweep.dir" else []
    code, err = run_main(monkeypatch, capsys, *sweep, "experiment=smoke", "progress=false", f"{key}={given}")
    said = "is a link to nothing" if what == "a link to nothing" else "is a file, not a folder"
    assert code == 2 and err == f"error: {key}={given}: cannot create the run folder, {given} {said}\n", err
    assert afile.read_text() == "the user's\n" and not (tmp_path / "nowhere").exists()


def _file_size_limit(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_a_file_size_limit_reached_in_a_checkpoint_is_one_line_naming_the_file(tmp_path):
    """The optimiser state (torch.save, ~360 KB here) passes the limit; the weights (~170 KB) do not. torch's writer
    fails with "unexpected pos", no errno: the limit is what says why."""
    run_dir = tmp_path / "run"
    args = cli("experiment=smoke", "progress=false", "iterations=2", "save_every=1", f"hydra.run.dir={run_dir}")
    out = subprocess.run(
        args,
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        preexec_fn=_file_size_limit(200 * 1024),
        timeout=300,
    )
    line = one_error_line(out)
    assert line.startswith(f"error: cannot write {run_dir / 'checkpoints'}/.tmp-iter_000001-"), line
    assert (
        "/algorithm/llm1/optimizer.pt (File too large)" in line and "Raise the file-size limit (`ulimit -f`)" in line
    )
    assert latest_checkpoint(run_dir) is None and (run_dir / "metrics.jsonl").read_text().count("\n") == 2
