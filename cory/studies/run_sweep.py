"""Run a sweep resumably on one machine: each job in its own fixed folder, finished jobs skipped, stopped ones resumed.

    cory-sweep --dir outputs/reproduction/runs/curves [--jobs 2] [--threads 1] \\
        [--results outputs/reproduction/results] \\
        experiment=cpu_imdb sweep=cpu_imdb_curves [more overrides, sweeps such as seed=0,1 included]

The jobs are exactly those of `cory-train -m <the same overrides>`: the sweep file's
`hydra.sweeper.params` and the command-line sweeps, expanded by Hydra's own basic sweeper. Each job runs as
`python -m cory.train <its overrides> hydra.run.dir=<DIR>/<what varies>/seed=<n>` in a subprocess with
`--threads` torch/OpenMP threads, `--jobs` at a time. Running the same command again
- skips a job whose folder holds a `summary.json` with `completed: true`,
- resumes one whose folder holds a run (`run_config.yaml`) with `python -m cory.train resume=<folder>`, at the
  thread count of its checkpoint, whatever `--threads` says now (the float rounding depends on it),
- starts the others afresh.
With `--results`, a job whose folder is gone (another machine, a lost session) but whose kept files there hold a
finished run is not run again: its files go back into its folder, and it counts as finished.
So a sweep killed at any point (Ctrl-C, `kill`, a reboot) continues where its checkpoints stand. With `--retries N`,
a job that a signal kills on its own (the kernel's out-of-memory killer, a `kill -9`) while the driver runs on is
resumed from its last checkpoint at once, in the slot it left, up to N times per job; a job that exits with an
error is not retried (its error would repeat). Ctrl-C or SIGTERM to this driver is passed once to every running
job, which finishes its iteration, checkpoints and exits; if the driver itself is killed with SIGKILL, its jobs get
SIGTERM (Linux). Each job's output goes to `<DIR>/logs/`.
With `--evaluate "ARGS"`, each job that finished training is then scored by `python -m cory.evaluate <its folder> ARGS
--out <its folder>/evaluation/sweep` in the same slot (pass@k of the base model and of every agent, paper Fig. 5),
and a job counts as done once that evaluation's `passk.json` exists; a run folder's checkpoints need not outlive
the session that trained them for its pass@k to be kept.
With `--results RESULTS`, each finished job's small files (`RESULT_FILES`: metrics, summary, MAFT's per-problem
outcomes, config, overrides, and with `--evaluate` its pass@k summary and per-problem rows; no checkpoint or weight)
are copied to `RESULTS/<the job's folder name>/` as soon as it finishes, so that they can be committed run by run
while the run folders (gigabytes of checkpoints) stay out of git.
At the end the sweep is summarised like a `-m` multirun (`cory.callbacks.summarise_sweep`): `frontier.{png,csv,
json}` in DIR and, with `logger=wandb`, the W&B summary run of the sweep's group.
Overrides that do not compose, `--jobs 0`, a second driver on the same folder, or a `--dir` or `--results` that
cannot be written is one line and exit code 2 (a job that fails says so in its log and the sweep goes on). The same
command: `python -m cory.studies.run_sweep`.
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cory.studies import command
from cory.studies.command import StudyError

LOCK = ".run_sweep.pid"
# what `--results` keeps of a finished run: enough to redraw its curves and recompute every statistic
RESULT_FILES = ("summary.json", "metrics.jsonl", "eval_outcomes.jsonl", "run_config.yaml", ".hydra/overrides.yaml")
PASSK = Path("evaluation") / "sweep"  # where `--evaluate` writes in a run folder (`cory.evaluate --out`)
PASSK_FILES = {"passk.json": "passk.json", "results.jsonl": "passk_results.jsonl"}  # copied under these names


def compose(overrides: list[str]):
    """The config `cory-train <overrides>` composes (sweep values left out), Hydra's part included."""
    return command.compose(overrides, hydra_config=True)


def expand(overrides: list[str]) -> tuple[list[list[str]], object]:
    """The jobs of `-m <overrides>` (each a list of `key=value`) and the config composed without sweep values."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from cory.errors import ConfigError, one_line

    parser = OverridesParser.create()
    try:
        fixed = [o.input_line for o in parser.parse_overrides(overrides) if not o.is_sweep_override()]
        cfg = compose(fixed)
        params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
        (jobs,) = BasicSweeper.split_arguments(parser.parse_overrides(params + overrides), max_batch_size=None)
    except HydraException as err:  # a malformed override (`seed=0,`, a quote left open): name it
        bad = next((o for o in overrides if not _parses(parser, o)), None)
        raise ConfigError(f"{bad}: {one_line(err)}" if bad else one_line(err)) from None
    return jobs, cfg


def _parses(parser, override: str) -> bool:
    from hydra.errors import HydraException

    try:
        parser.parse_overrides([override])
    except HydraException:
        return False
    return True


def job_folders(jobs: list[list[str]], root: Path, default_seed: int) -> list[Path]:
    """`root/<overrides that vary between jobs, but the seed>/seed=<n>`: the folder reads like the sweep's table."""
    varying = {o.split("=", 1)[0] for o in {o for job in jobs for o in job} if not all(o in job for job in jobs)}
    folders = []
    for job in jobs:
        values = dict(o.split("=", 1) for o in job)
        name = ",".join(f"{k}={values[k]}" for k in sorted(varying - {"seed"}) if k in values) or "run"
        folders.append(root / name / f"seed={values.get('seed', default_seed)}")
    if len(set(folders)) != len(folders):
        raise StudyError("two jobs map to one folder; give every swept key a distinct value")
    return folders


def state(folder: Path, evaluate: bool = False) -> str:
    """ "done" (completed summary, and its pass@k with `evaluate`), "evaluate" (trained, pass@k owed), "resume" (a
    run is there), or "fresh"."""
    try:
        if json.loads((folder / "summary.json").read_text()).get("completed"):
            return "evaluate" if evaluate and not (folder / PASSK / "passk.json").is_file() else "done"
    except (OSError, ValueError, AttributeError):
        pass
    return "resume" if (folder / "run_config.yaml").is_file() else "fresh"


def kept_files() -> list[tuple[Path, str]]:
    """(path in a run folder, name among its kept results) for every file `--results` keeps: `RESULT_FILES` under
    their own names (`.hydra/x` becomes `x`), the pass@k files under `PASSK_FILES`' names."""
    return [(Path(name), Path(name).name) for name in RESULT_FILES] + [
        (PASSK / name, kept_as) for name, kept_as in PASSK_FILES.items()
    ]


def collect(folder: Path, dest: Path) -> None:
    """Copy a finished run's kept files (`kept_files`) to `dest`."""
    with command.output(dest, "--results"):
        dest.mkdir(parents=True, exist_ok=True)
        for path, kept_as in kept_files():
            if (folder / path).is_file():
                shutil.copyfile(folder / path, dest / kept_as)


def restore(kept: Path, folder: Path, evaluate: bool = False) -> bool:
    """Put a finished run's kept small files (`collect`) back into its absent `folder`, where they were; True if done.

    A sweep that outlives its machine: the run folders (with their checkpoints) are gone, the committed results are
    not. A job whose results hold a completed summary (and its pass@k with `evaluate`) is then finished, not run
    again, and the sweep's summary still counts it.
    """
    if folder.exists() or state(kept, evaluate=False) != "done" or (evaluate and not (kept / "passk.json").is_file()):
        return False
    for path, kept_as in kept_files():
        if (kept / kept_as).is_file():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kept / kept_as, folder / path)
    return True


def evaluate_command(folder: Path, args: list[str]) -> list[str]:
    """`python -m cory.evaluate <folder> <args> --out <folder>/evaluation/sweep` (a killed one continues there)."""
    return [sys.executable, "-m", "cory.evaluate", str(folder), *args, "--out", str(folder / PASSK)]


def train_command(job: list[str], folder: Path, how: str, alias: Path) -> list[str]:
    """The job's `python -m cory.train` command line: a fresh start into `folder`, or its resume.

    Folder names hold `=` and `,`, which Hydra's override grammar accepts only quoted; `resume=` takes a plain path,
    so a resume goes through `alias`, a symlink to the folder with a plain name (the run still writes into it).
    """
    if how == "resume":
        alias.parent.mkdir(parents=True, exist_ok=True)
        alias.unlink(missing_ok=True)
        alias.symlink_to(os.path.relpath(folder, alias.parent), target_is_directory=True)
        return [sys.executable, "-m", "cory.train", f"resume={alias}", "progress=false"]
    # `hydra.mode=RUN`: a sweep file sets MULTIRUN; here each job is one run in its own folder
    return [sys.executable, "-m", "cory.train", *job, "progress=false", "hydra.mode=RUN", f"hydra.run.dir='{folder}'"]


def warm_caches(job: list[str]) -> None:
    """Build the cached assets of the job's model and reward (converted weights, a trained classifier) once, here,
    instead of in every parallel job at the same time; a failure is left for the jobs to report."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from cory.build import load_model

    cfg = compose([o for o in job if not o.startswith("hydra.")])
    # the model through the entry point's own loader (the node also holds keys for the agents, not the loader)
    for key, build in (("model", load_model), ("task.reward", instantiate)):
        node = OmegaConf.select(cfg, key)
        if node is not None and "cache_dir" in node:
            try:
                build(node)
            except Exception as exc:  # noqa: BLE001
                print(f"[sweep] could not prepare {key} ({exc}); the jobs will say why", flush=True)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the driver dies (Linux prctl), so no job outlives a killed driver."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Driver:
    """Runs the jobs `jobs` at a time; one signal to the driver is passed once to every running job."""

    def __init__(
        self, jobs: int, threads: int, log_dir: Path, on_done=None, evaluate: bool = False, retries: int = 0
    ) -> None:
        self.slots, self.log_dir, self.on_done, self.evaluate = jobs, log_dir, on_done, evaluate
        self.retries: dict[str, int] = collections.defaultdict(lambda: retries)  # left, per job
        self.env = os.environ | {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.running: dict[subprocess.Popen, tuple[str, Path, float, list[list[str]]]] = {}
        self.stopping = False

    def stop(self, signum: int, _frame) -> None:
        if not self.stopping:
            print(f"[sweep] {signal.Signals(signum).name}: stopping the running jobs at a checkpoint", flush=True)
            for proc in self.running:
                proc.send_signal(signal.SIGTERM)
        self.stopping = True

    def run(self, todo: list[tuple[str, Path, list[list[str]]]], resume=None) -> None:
        """Each job's commands (train or resume, then `--evaluate`'s) one after another in one slot; a command that
        fails or is stopped ends the job's turn (the next start of the same sweep command picks the job up again),
        except that a job killed by a signal with retries left goes back to the front of the queue as `resume(name)`
        gives its commands."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        while (todo and not self.stopping) or self.running:
            while todo and not self.stopping and len(self.running) < self.slots:
                name, folder, (cmd, *rest) = todo.pop(0)
                self._start(name, folder, cmd, rest)
            time.sleep(0.2)
            for proc in [p for p in self.running if p.poll() is not None]:
                name, folder, t0, rest = self.running.pop(proc)
                where = state(folder, self.evaluate)
                now = {"done": "finished", "evaluate": "trained"}.get(where, "stopped")
                outcome = "failed" if proc.returncode else now
                print(f"[sweep] {outcome} after {time.time() - t0:.0f} s (exit {proc.returncode}): {name}", flush=True)
                # a signal ended it, and there is a run to resume (or its pass@k to score)
                killed = proc.returncode < 0 and where in ("resume", "evaluate")
                if killed and resume is not None and not self.stopping and self.retries[name] > 0:
                    self.retries[name] -= 1
                    why = signal.Signals(-proc.returncode).name
                    print(f"[sweep] retry {name}: killed by {why}; resuming from its last checkpoint "
                          f"({self.retries[name]} retries left)", flush=True)  # fmt: skip
                    todo.insert(0, (name, folder, resume(name)))
                if outcome == "trained" and rest and not self.stopping:
                    self._start(name, folder, rest[0], rest[1:])
                if outcome == "finished" and self.on_done is not None:
                    self.on_done(name, folder)

    def _start(self, name: str, folder: Path, cmd: list[str], rest: list[list[str]]) -> None:
        log = (self.log_dir / f"{name.replace('/', '_')}.log").open("a")
        print(f"[sweep] start {name}: {' '.join(cmd[2:])}", flush=True)
        proc = subprocess.Popen(
            cmd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C reaches the driver, which passes it on exactly once
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        log.close()
        self.running[proc] = (name, folder, time.time(), rest)


def _alive(lock: Path) -> bool:
    """Whether the pid in `lock` is a live process (a driver already working on this sweep)."""
    try:
        os.kill(int(lock.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def run(argv: Sequence[str] | None = None, prog: str = "cory-sweep") -> int:
    parser = command.parser(prog, __doc__)
    parser.add_argument("--dir", type=Path, required=True, help="the sweep folder (fixed, so a rerun resumes)")
    parser.add_argument("--jobs", type=command.positive_int, default=2, help="runs at a time (default 2)")
    parser.add_argument(
        "--threads", type=command.positive_int, default=1, help="torch/OpenMP threads per run (default 1)"
    )
    parser.add_argument("--results", type=Path, help="copy each finished run's small files here (to commit)")
    parser.add_argument(
        "--evaluate",
        metavar="ARGS",
        help='then score each trained run with `cory-evaluate <run> ARGS` (e.g. "--n 8"): its pass@k',
    )
    parser.add_argument(
        "--retries",
        type=command.non_negative_int,
        default=0,
        help="resume a job killed by a signal (out of memory, kill -9) up to this many times (default 0)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, sweeps included")
    args = parser.parse_args(argv)
    try:
        evaluate_args = shlex.split(args.evaluate) if args.evaluate is not None else None
    except ValueError as err:
        parser.error(f"--evaluate {args.evaluate!r}: {err}")

    jobs, cfg = expand(args.overrides)
    root = args.dir.resolve()
    folders = job_folders(jobs, root, cfg.seed)
    lock = root / LOCK
    if _alive(lock):
        raise StudyError(
            f"another cory-sweep (pid {lock.read_text().strip()}) is running in {root}; wait for it or stop it"
        )
    with command.output(root, "--dir"):
        root.mkdir(parents=True, exist_ok=True)
        lock.write_text(str(os.getpid()))
    evaluate = evaluate_args is not None
    evaluation = [evaluate_command(f, evaluate_args) for f in folders] if evaluate else []

    def commands(i: int, how: str) -> list[list[str]]:
        """Job i's commands from where its folder stands (`state`): its training, fresh or resumed, unless only its
        pass@k is owed; then `--evaluate`'s."""
        train = [] if how == "evaluate" else [train_command(jobs[i], folders[i], how, root / ".resume" / str(i))]
        return train + evaluation[i : i + 1]

    try:
        todo, index = [], {}
        for i, folder in enumerate(folders):
            name = str(folder.relative_to(root))
            if args.results is not None and restore(args.results / name, folder, evaluate):
                print(f"[sweep] skip (finished; its files restored from {args.results / name}): {name}")
                continue
            how = state(folder, evaluate)
            if how == "done":
                print(f"[sweep] skip (finished): {name}")
                if args.results is not None:
                    collect(folder, args.results / name)
                continue
            if how == "fresh" and folder.exists():  # stopped before writing its config: only Hydra's files are there
                if (folder / "checkpoints").exists() or (folder / "metrics.jsonl").exists():
                    print(f"[sweep] skip (a run without run_config.yaml; move it away to rerun): {name}")
                    continue
                shutil.rmtree(folder)
            todo.append((name, folder, commands(i, how)))
            index[name] = i
        print(f"[sweep] {len(jobs)} jobs, {len(todo)} to run ({args.jobs} at a time) in {root}", flush=True)
        if args.jobs > 1 and len(todo) > 1:
            warm_caches(jobs[0])
        on_done = None if args.results is None else (lambda name, folder: collect(folder, args.results / name))
        driver = Driver(args.jobs, args.threads, root / "logs", on_done, evaluate, args.retries)
        previous = {s: signal.signal(s, driver.stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            # a killed job's commands, from where its folder stands now
            driver.run(todo, lambda name: commands(index[name], state(folders[index[name]], evaluate)))
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        lock.unlink(missing_ok=True)

    unfinished = [str(f.relative_to(root)) for f in folders if state(f, evaluate) != "done"]
    if unfinished:
        again = "run the same command again to resume"
        print(f"[sweep] {len(unfinished)} unfinished (logs in {root / 'logs'}); {again}: {', '.join(unfinished)}")
        return 1
    from cory.callbacks import summarise_sweep

    summarise_sweep(root, cfg)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return command.guard(run, argv)


if __name__ == "__main__":
    sys.exit(main())
