"""The command line around Hydra: checks that must happen before Hydra writes anything, and one-line errors.

`prepare(argv)` runs before Hydra starts:
- `resume=<folder>` becomes `hydra.run.dir=<folder>` (the run continues in place); it is refused with `-m` or
  with an explicit `hydra.run.dir` (a resumed run never moves), and when the folder is not a run folder;
- a new run's folder (`hydra.run.dir`, or the default under `outputs/`) must be creatable and writable, and an
  explicit one must not hold a run already (Hydra would overwrite its `.hydra/` before the run could refuse);
- a sweep that sweeps a key the folder names leave out (`cory/conf/train.yaml`'s `exclude_keys`) gets that key back
  in its job folder names, so two jobs never share a folder;
- the overrides are composed once (a sweep's: each option it names), so a wrong option or key, or a value Hydra's
  grammar cannot read, is one `error:` line with the right hint ("did you mean ...?", how to quote);
- flags may come anywhere among the overrides (`experiment=smoke -m seed=0,1`); flags that cannot go together
  (`-m` with `--cfg`) are one line too;
- a SLURM job that was requeued and runs its command again resumes its own run (`runs.requeue_of`): the folder
  its command names, or its run among the default folders, as if `resume=<folder>` had been typed.

`run_hydra` then runs the app with Hydra's own error reports off, so that a composition error or a failed
sweep job reaches us and is printed as one line (exit code 2) instead of a traceback.

`help_text` is `cory-train --help`: the experiments, the algorithms and the ten most used overrides. This module
imports neither torch nor the run layer at its top (`cory.runs` loads inside the functions that need it), so help
and Hydra's tab completion answer at once.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cory.errors import ConfigError, did_you_mean, one_line

CONF_DIR = Path(__file__).resolve().parent / "conf"
DEFAULT_RUNS = Path("outputs/runs")  # where `cory/conf/train.yaml` puts a run's folder when none is given
_typed: list[str] = []  # the overrides this process's command line typed (`prepare`), before any resume is added
_HELP = {"-h", "--help", "--hydra-help", "--version", "--shell-completion", "-sc", "--info", "-i"}
DOCS = "docs/running.md#override-cookbook"  # every override, with examples (in the source repository)


class SweepJobError(Exception):
    """A sweep job failed with a user error (already printed by the job); raised so Hydra marks it failed."""


_PLAIN_PATH = re.compile(r"[\w./~:+-]*", re.ASCII)


def quote_path_override(override: str) -> str:
    """`key=<path>` with the path quoted for Hydra's override grammar when it needs it: any folder a shell can
    pass (a sweep job's `…/iterations=2/seed=0`, spaces, non-ASCII) is one value, not an error."""
    key, value = override.split("=", 1)
    if _PLAIN_PATH.fullmatch(value) or value[:1] in "'\"":
        return override
    quote = "'" if "'" not in value else '"'
    if quote in value:
        raise ConfigError(f"{key}={value}: a path holding both kinds of quotes cannot be passed to Hydra")
    return f"{key}={quote}{value}{quote}"


def unquote(value: str) -> str:
    """A value as Hydra will see it: without the quotes `quote_path_override` (or the user) put around it."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def override_key(override: str) -> str:
    """The dotted key an override sets: `+a.b=1` → `a.b`, `task/reward=x` → `task.reward`, `~a` → `a`."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key.replace("/", ".")


def _parse(args: Sequence[str]):
    """Hydra's own reading of the command line (flags and overrides), or None for help-like commands.

    Flags may come anywhere among the overrides (`experiment=smoke -m seed=0,1`, which Hydra's own parser refuses);
    a malformed flag, or flags that cannot go together, raise `ConfigError`.
    """
    if _HELP & set(args):
        return None
    from hydra._internal.utils import get_args_parser  # the parser @hydra.main itself uses

    parser = get_args_parser()

    def refuse(message: str) -> None:  # instead of argparse's usage block and exit
        raise ConfigError(f"{message}; see `{prog_name('cory-train', 'python -m cory.train')} --help`")

    parser.error = refuse
    parsed = parser.parse_intermixed_args(list(args))
    modes = [flag for flag, on in (("-m", parsed.multirun), ("--run", parsed.run), ("--cfg", parsed.cfg)) if on]
    if len(modes) > 1:  # Hydra raises a ValueError (a traceback) for these
        raise ConfigError(
            f"{' and '.join(modes)} cannot go together: --cfg prints the config of one run and runs nothing; drop -m "
            "and give each swept key one value to see that job's config"
            if "--cfg" in modes
            else f"{' and '.join(modes)} cannot go together: -m runs a sweep, --run one run"
        )
    return parsed


def _flags_first(args: list[str], overrides: list[str]) -> list[str]:
    """The command line as Hydra's parser takes it: the flags (with their values), then the overrides in order."""
    rest = list(overrides)
    flags = []
    for arg in args:
        if rest and arg == rest[0]:
            rest.pop(0)
        else:
            flags.append(arg)
    return flags + list(overrides)


def prepare(args: list[str]) -> list[str]:
    """The argv Hydra should see; exits with one `error:` line (code 2) when the command cannot run."""
    try:
        args = [quote_path_override(a) if a.startswith(("resume=", "hydra.run.dir=")) else a for a in args]
        parsed = _parse(args)
        if parsed is None:  # help and tab completion: Hydra answers, and nothing slow is imported
            return args
        from cory import runs

        args = _flags_first(args, parsed.overrides)
        _typed[:] = list(parsed.overrides)
        requeued = _requeued_run(parsed)
        if requeued is not None:  # the same command again, after SLURM requeued the job: continue its run
            print(
                f"[cory] SLURM job {runs.slurm_job()} was requeued (restart {runs.slurm_restart()}): resuming its "
                f"run in {requeued}",
                flush=True,
            )
            args = [a for a in args if not a.startswith("hydra.run.dir=")]
            args.append(quote_path_override(f"resume={requeued}"))
            parsed = _parse(args)
        overrides = list(parsed.overrides)
        _check_grammar(overrides)
        values = {override_key(o): unquote(o.split("=", 1)[1]) for o in overrides if "=" in o}
        primary = int(os.environ.get("RANK", "0")) == 0  # data-parallel: rank 0 checks, all ranks follow
        extra = []
        runs.check_resume_value(values.get("resume"))
        if values.get("resume", "null") not in ("null", ""):
            extra = _resume_args(values, parsed.multirun, overrides)
            # Hydra composes the run's own command (so its keys exist) with this one's overrides on top
            flags = [a for a in args if a not in overrides]
            overrides = resume_overrides(Path(values["resume"]), overrides)
            args = flags + overrides
        elif parsed.multirun or _sweep_file(values):
            sweep_dir = Path(values.get("hydra.sweep.dir", "outputs/multiruns"))
            runs.check_writable(sweep_dir, "hydra.sweep.dir")
            if "hydra.sweep.dir" in values and (sweep_dir / "multirun.yaml").exists():
                extra = _continue_sweep(sweep_dir, [o for o in overrides if not _is_hydra_override(o)], primary)
            extra += _exclude_keys_args(overrides)
        elif primary:
            run_dir = Path(values.get("hydra.run.dir", "outputs/runs"))
            runs.check_writable(run_dir, "hydra.run.dir")
            if "hydra.run.dir" in values:
                runs.refuse_if_taken(run_dir, "hydra.run.dir")
        swept = _sweeps(overrides)
        multirun = parsed.multirun or values.get("hydra.mode") == "MULTIRUN"
        if swept and not multirun and not _sweep_file(values):  # Hydra's own message is a numbered list
            key = swept[0].key_or_group
            what = (
                "give it one value: --cfg prints one run's config" if parsed.cfg else "add -m to run one job per value"
            )
            raise ConfigError(
                f"{swept[0].input_line}: a comma list is a sweep; {what} (a list value is written {key}=[a,b], a "
                f"string with a comma {key}='a,b')"
            )
        if multirun or _sweep_file(values):
            check_sweep_composes(overrides)  # before Hydra creates the sweep's folder
        else:
            check_composes(overrides + extra)
    except ConfigError as err:
        print(f"error: {one_line(err)}", file=sys.stderr, flush=True)
        sys.exit(2)
    return args + extra


def _is_hydra_override(override: str) -> bool:
    return override_key(override).split(".")[0] == "hydra"


def _continue_sweep(sweep_dir: Path, task_overrides: list[str], primary: bool) -> list[str]:
    """A sweep folder given again (`hydra.sweep.dir=`) with the sweep's own overrides continues that sweep: each job
    resumes its run (`cory.train`; a finished one does nothing), a job never started starts. Hydra's record of this
    start goes to `.hydra/resumed/`, leaving each job's first one. Any other sweep there is refused."""
    try:
        recorded = OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides.task
        recorded = [str(o) for o in recorded]
    except Exception:  # noqa: BLE001 - unreadable, or not Hydra's: not a sweep this command can continue
        recorded = None
    if recorded != task_overrides:
        raise ConfigError(
            f"hydra.sweep.dir={sweep_dir} already holds a sweep"
            + (f" of other overrides ({' '.join(recorded)})" if recorded else "")
            + "; rerun that sweep's own command to continue it, or choose a new folder"
        )
    if primary:
        print(f"[cory] continuing the sweep in {sweep_dir}: finished jobs are kept, stopped ones resume", flush=True)
    return ["hydra.output_subdir=.hydra/resumed"]


def _requeued_run(parsed) -> Path | None:
    """The run folder a restarted SLURM job resumes without being told (`runs.requeue_of`): the folder its command
    names (`hydra.run.dir=`), or its run among the default folders; None for any other command."""
    from cory import runs

    if parsed.multirun or parsed.cfg is not None or not runs.slurm_job() or runs.slurm_restart() < 1:
        return None
    values = {override_key(o): unquote(o.split("=", 1)[1]) for o in parsed.overrides if "=" in o}
    if values.get("resume", "null") not in ("null", "") or _sweep_file(values):
        return None
    if "hydra.run.dir" in values:
        folder = Path(values["hydra.run.dir"])
        return folder if runs.requeue_of(folder) else None
    return runs.requeued_run_under(DEFAULT_RUNS)


def _sweep_file(values: dict[str, str]) -> bool:
    return values.get("sweep", "null") != "null"


def _sweeps(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return []  # reported by the composition check (single run) or by Hydra (sweep)
    return [o for o in parsed if o.is_sweep_override() and not o.is_hydra_override()]


def _resume_args(values: dict[str, str], multirun: bool, overrides: list[str]) -> list[str]:
    from cory import runs

    folder = values["resume"]
    if multirun:
        raise ConfigError(f"resume={folder}: a resume continues one run; it cannot be part of a -m sweep")
    if "hydra.run.dir" in values:
        raise ConfigError(
            f"resume={folder} continues the run in its own folder; drop hydra.run.dir={values['hydra.run.dir']} "
            f"(to run the experiment elsewhere, start a new run there)"
        )
    if not os.path.isdir(folder):  # checked before Hydra, which would create the folder
        raise ConfigError(f"resume={folder}: no such run folder")
    # checked whole before Hydra writes there or builds its callbacks: what the folder may set, its layout, records
    runs.check_resume(Path(folder), runs.typed(overrides))
    # Hydra's snapshot of this start (the default config + the resume command) must not replace the run's own;
    # `hydra.mode=RUN`: one run, even when its first start named a sweep file (which sets MULTIRUN) in run mode,
    # as `cory-sweep` starts each job
    run_dir = quote_path_override(f"hydra.run.dir={os.path.abspath(folder)}")
    return [run_dir, "hydra.output_subdir=.hydra/resumed", "hydra.mode=RUN"]


def typed_overrides() -> list[str]:
    """What this process's command line typed (empty when `cory.train` was not started from one): a `_target_`
    named there is the user's choice, also when a resume or a requeue repeats the run's own recorded overrides."""
    return list(_typed)


def forget_typed_overrides() -> None:
    _typed.clear()


def resume_overrides(folder: Path, overrides: list[str]) -> list[str]:
    """The overrides a resume command composes: the run's first start's, minus the keys given again, then these."""
    from cory import runs

    given = {override_key(o) for o in overrides}
    return [o for o in runs.original_overrides(folder) if override_key(o) not in given] + overrides


def _exclude_keys_args(overrides: list[str]) -> list[str]:
    """Keys that folder names leave out (seed aside, always in them) but that this sweep varies go back in."""
    excluded = list(OmegaConf.load(CONF_DIR / "train.yaml").hydra.job.config.override_dirname.exclude_keys)
    swept = {o.key_or_group for o in _sweeps(overrides)}
    keep = [k for k in excluded if k == "seed" or k not in swept]
    if keep == excluded:
        return []
    return [f"hydra.job.config.override_dirname.exclude_keys=[{','.join(keep)}]"]


def check_composes(overrides: list[str]) -> None:
    """A wrong option (`task/reward=nope`) or key (`algorithm.agent.lr=1`) as one `error:` line with the right hint
    (`explain`) and exit code 2, like every other configuration error, instead of Hydra's multi-line report."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    job = [o for o in overrides if not o.startswith("hydra.")]
    try:
        compose(job)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(explain(err, job)) from None


def check_sweep_composes(overrides: list[str]) -> None:
    """A sweep's overrides compose before Hydra creates its folder: the first value of every swept key, then each
    other option of a swept config group (`algorithm=ppo,coryy`) in turn, as Hydra's sweeper writes them. A swept
    value of the wrong type or range is refused by each job's own validation (`cory.config`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    jobs: list[str] = []
    options: list[tuple[int, str]] = []
    for raw, override in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        if raw.startswith("hydra.") or override.is_hydra_override():
            continue
        if not override.is_sweep_override():
            jobs.append(raw)
            continue
        try:
            values = list(override.sweep_string_iterator())
        except Exception:  # noqa: BLE001 - glob() and interval sweeps: Hydra's sweeper expands them itself
            continue
        key = override.get_key_element()
        if values:
            jobs.append(f"{key}={values[0]}")
            if override.key_or_group in _groups():
                options += [(len(jobs) - 1, f"{key}={v}") for v in values[1:]]
    check_composes(jobs)
    for i, option in options:
        check_composes([*jobs[:i], option, *jobs[i + 1 :]])


def _check_grammar(overrides: list[str]) -> None:
    """Each override reads under Hydra's grammar; one that does not is named with how to quote it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for i, raw in enumerate(overrides):
        try:
            parser.parse_overrides([raw])
        except HydraException:
            raise ConfigError(_grammar_hint(raw, overrides[i + 1 :])) from None


def _grammar_hint(raw: str, following: list[str]) -> str:
    """Why Hydra cannot read `raw`, and the override written so that it can."""
    if "=" not in raw:
        return (
            f"{raw}: not an override; write key=value (seed=1), +key=value to add a key, ~key to remove one; "
            f"see {DOCS}"
        )
    key, value = raw.split("=", 1)
    # words after it without `=` are most likely the rest of its value, split by the shell at a space
    split = []
    for word in following:
        if "=" in word or word.startswith(("-", "+", "~")):
            break
        split.append(word)
    value = " ".join([value, *split])
    unclosed = any(value.count(q) % 2 for q in "'\"")
    bare = value.strip("'\"")
    inner = "'" if "'" not in bare else '"'
    outer = '"' if inner == "'" else "'"
    why = (
        "the shell split its value at a space"
        if split
        else "an unclosed quote"
        if unclosed
        else "a value holding characters Hydra reads as syntax: spaces, {}, [], commas, quotes, $, =, :"
    )
    return (
        f"{raw}{' ' + ' '.join(split) if split else ''}: Hydra cannot read this override ({why}); quote the value "
        f"for Hydra and the whole override for the shell: {outer}{key}={inner}{bare}{inner}{outer} (see {DOCS})"
    )


def explain(err: BaseException, overrides: Sequence[str]) -> str:
    """Hydra's composition error for `overrides` as one line with the right hint: the key or option a typo
    probably meant ("did you mean algorithm=ppo?"), never Hydra's `+key=` for a typo, and how to quote a value."""
    text = one_line(err).split(" Config search path:")[0]  # the search path is noise
    if "override_grammar" in text:  # Hydra's link to its grammar: an override it cannot read
        bad = [o for o in overrides if _unreadable(o)]
        if bad:
            return _grammar_hint(bad[0], list(overrides)[list(overrides).index(bad[0]) + 1 :])
    if match := re.search(r"Could not override '([^']+)'\. No match in the defaults list", text):
        group = match.group(1)
        raw = _override_of(group, overrides)
        parent = group.rsplit("/", 1)[0]
        chosen = _choice(parent, [o for o in overrides if o != raw])
        return (
            f"{raw}: the chosen {parent}{f' ({chosen})' if chosen else ''} has no {group} to choose; "
            f"{group} applies to a {parent} that takes one"
            + (f" ({', '.join(_users_of(group))})" if _users_of(group) else "")
        )
    if match := re.search(r"Could not override '([^']+)'", text):
        key, inner = match.group(1), _missing_inner_key(err)
        if inner is not None and inner.startswith(key + "."):  # `key={...}`: the key exists, one inside does not
            return _unknown_inner_key(key, inner, overrides)
        return _unknown_key(key, overrides)
    if match := re.search(r"Could not find '([^']+)/([^/']+)'", text):
        group, option = match.groups()
        listed = re.search(rf"Available options in '{re.escape(group)}': (.*)$", text)
        options = listed.group(1).split() if listed else []
        guess = did_you_mean(option, options)
        return (
            f"{group}={option}: no such option"
            + (f"; did you mean {group}={guess}?" if guess else "")
            + (f" (available: {', '.join(options)})" if options else f" (no config {group}/{option}.yaml)")
        )
    return text


def _unreadable(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        OverridesParser.create().parse_overrides([override])
    except HydraException:
        return True
    return False


def _override_of(key: str, overrides: Sequence[str]) -> str:
    """The override (as typed) that sets `key`, or the key itself."""
    return next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), key)


def _refused(key: str, overrides: Sequence[str], placeholder: str) -> tuple[str, str, set[str]]:
    """The override that set `key` (as typed), its value (`placeholder` if none) and every key the other overrides
    compose: what both unknown-key answers start from."""
    raw = _override_of(key, overrides)
    value = raw.split("=", 1)[1] if "=" in raw else placeholder
    return raw, value, _known_keys([o for o in overrides if o != raw])


def _unknown_key(key: str, overrides: Sequence[str]) -> str:
    """`key` is in no config: name the key a typo probably meant, else what is there."""
    raw, value, known = _refused(key, overrides, "...")
    dotted = key.replace("/", ".")
    guess = _closest_key(dotted, known)
    if guess is not None:
        shown = guess.replace(".", "/") if "/" in key else guess
        return f"{raw}: no key {key} in the config; did you mean {shown}={value}?"
    parts = dotted.split(".")
    depth = max(i for i in range(len(parts)) if i == 0 or ".".join(parts[:i]) in known)
    parent = ".".join(parts[:depth])
    children = sorted({k.split(".")[depth] for k in known if depth == 0 or k.startswith(parent + ".")} - {""})
    shown = ", ".join(children[:15]) + (", ..." if len(children) > 15 else "")
    return (
        f"{raw}: no key {key} in the config ({parent or 'the top level'} has {shown}; --cfg job prints every key); "
        f"to add a key the config does not have on purpose (an argument its _target_ takes): +{key}={value}"
    )


def _missing_inner_key(err: BaseException) -> str | None:
    """The full key OmegaConf refused under Hydra's "Could not override" (`task.reward.value` for
    `task.reward={...,value:1}`), found in the chain of causes; None if none names one."""
    seen: BaseException | None = err.__cause__
    while seen is not None:
        if isinstance(getattr(seen, "full_key", None), str) and seen.full_key:
            return seen.full_key
        seen = seen.__cause__
    return None


def _unknown_inner_key(key: str, inner: str, overrides: Sequence[str]) -> str:
    """`key={..., x: v}` where `key` has no `x`: Hydra merges a dict value into the node key by key, so the new key is
    refused. Name it and the node's keys, and both ways on: the key typed wrong, or a whole new node in the old one's
    place (`~key '+key={...}'`: delete, then add)."""
    raw, value, known = _refused(key, overrides, "{...}")
    below = {k for k in known if k.startswith(key + ".")}
    guess = _closest_key(inner, below)
    have = sorted({k[len(key) + 1 :].split(".")[0] for k in below})
    name = inner[len(key) + 1 :]
    typo = f"; did you mean {guess[len(key) + 1 :]}?" if guess is not None else "."
    return (
        f"{raw}: {key} has no key {name} ({key} has {', '.join(have) or 'no keys'}){typo} A {{...}} value is merged "
        f"into {key} key by key; to put a new node in its place, delete the old one first: ~{key} '+{key}={value}'"
    )


def _known_keys(overrides: Sequence[str]) -> set[str]:
    """Every dotted key of the config these overrides compose (the defaults, if they do not), and every config
    group (`task.reward`), which may name an option not chosen."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    keys = {g.replace("/", ".") for g in _groups()}
    for attempt in (list(overrides), []):
        try:
            cfg = compose([o for o in attempt if not o.startswith("hydra.")])
        except (HydraException, OmegaConfBaseException):
            continue

        def walk(node, prefix: str) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    keys.add(f"{prefix}{k}")
                    walk(v, f"{prefix}{k}.")

        walk(OmegaConf.to_container(cfg, resolve=False), "")
        break
    return keys


def _closest_key(key: str, known: set[str]) -> str | None:
    """The known key `key` probably meant: each dotted part corrected to its nearest sibling (`algoritm.agent.lr`
    → `algorithm.agent.lr` if it exists), else the one key elsewhere with the same last part (`learning_rate` →
    `algorithm.agent.learning_rate`)."""
    fixed: list[str] = []
    for part in key.split("."):
        prefix = ".".join(fixed)
        children = (
            {k[len(prefix) + 1 :].split(".")[0] for k in known if k.startswith(prefix + ".")}
            if prefix
            else {k.split(".")[0] for k in known}
        )
        match = part if part in children else did_you_mean(part, children)
        if match is None:
            break
        fixed.append(match)
    else:
        guess = ".".join(fixed)
        if guess != key and guess in known:
            return guess
    last = key.rsplit(".", 1)[-1]
    elsewhere = [k for k in known if k.rsplit(".", 1)[-1] == last and k != key]
    return elsewhere[0] if len(elsewhere) == 1 else None


def _groups() -> set[str]:
    """The config groups of `cory/conf` (`algorithm`, `task/reward`, ...), Hydra's own left out."""
    return {
        str(d.relative_to(CONF_DIR))
        for d in CONF_DIR.rglob("*")
        if d.is_dir() and d.relative_to(CONF_DIR).parts[0] != "hydra" and any(d.glob("*.yaml"))
    }


def _choice(group: str, overrides: Sequence[str]) -> str | None:
    """The option of `group` these overrides choose (None if they do not compose)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = compose([o for o in overrides if not o.startswith("hydra.")], hydra_config=True)
    except (HydraException, OmegaConfBaseException):
        return None
    return cfg.hydra.runtime.choices.get(group)


def _users_of(group: str) -> list[str]:
    """The options of the parent group whose YAML chooses a `group` (`task/reward`: imdb)."""
    parent, name = group.rsplit("/", 1) if "/" in group else ("", group)
    pattern = re.compile(rf"^\s*-\s*(override\s+)?/?{re.escape(name)}\s*:", re.M)
    return sorted(p.stem for p in (CONF_DIR / parent).glob("*.yaml") if pattern.search(p.read_text(encoding="utf-8")))


def compose(overrides: Sequence[str], hydra_config: bool = False) -> DictConfig:
    """The job config `python -m cory.train <overrides>` composes, inside a running Hydra app or outside one;
    `hydra_config`: with Hydra's own node (`hydra.*`: sweeper parameters, folder names)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=hydra_config)
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=hydra_config)


def run_hydra(app: Callable[[], None]) -> None:
    """Run the `@hydra.main` app; a composition error or a failed sweep job becomes one `error:` line.

    With `HYDRA_FULL_ERROR=1` Hydra re-raises instead of printing its own report, so the failure reaches here.
    A failed sweep job has printed its own `error:` line already; the sweep's other jobs have run.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except SweepJobError as err:
        print(f"error: a sweep job failed ({one_line(err)}); the other jobs ran", file=sys.stderr, flush=True)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"error: {explain(err, typed_overrides())}", file=sys.stderr, flush=True)
        sys.exit(2)


# ---------------------------------------------------------------------------------------------------- --help
# The README's table "The ten most used overrides", row for row (tests/test_console.py keeps the two equal).
TEN_OVERRIDES = (
    ("algorithm=ppo, algorithm=cory, algorithm=maft", "the method (every algorithm is listed above)"),
    ("experiment=smoke", "a preset of cory/conf/experiment/ (listed above)"),
    ("hardware=gpu", "cpu (default), gpu, multi_gpu, deepspeed_zero2, deepspeed_zero3, fsdp"),
    ("logger=wandb", "log to W&B too (offline without an API key); metrics.jsonl is always written"),
    ("-m seed=0,1,2", "a sweep: one run per combination of the comma lists, each in its own folder"),
    ("-m sweep=fig3_imdb", "a paper figure's sweep from cory/conf/sweep/"),
    ("iterations=24", "the run's length; with resume=, extends a finished run"),
    ("resume=<run folder>", "continue a stopped run from its last checkpoint, with its own config"),
    (
        "model.name_or_path=/data/gpt2",
        "a local copy of a Hub model (also task.reward.name_or_path, task.dataset_name)",
    ),
    ("algorithm.agent.learning_rate=3e-5", "any learner hyperparameter: algorithm.agent.* (--cfg job lists them)"),
)
DOC_PAGES = (
    ("README.md", "the paper's figures and claims, one command each"),
    ("docs/running.md", "config groups, every override, sweeps, W&B, SLURM, resuming"),
    ("docs/method.md", "the method as implemented"),
    ("docs/guarantees.md", "what holds when runs are killed, resumed or misconfigured"),
    ("docs/extending.md", "your own algorithm, learner, task or reward"),
)


def wants_help(args: Sequence[str]) -> bool:
    """`-h` or `--help` anywhere on the command line: our help text (`--hydra-help` is Hydra's)."""
    return "-h" in args or "--help" in args


def prog_name(console: str, module: str) -> str:
    """How this process was started, as a user would type it: the console command or `python -m <module>`."""
    return console if Path(sys.argv[0]).name == console else module


def help_text(prog: str) -> str:
    """`cory-train --help`: usage, the experiments and algorithms (each with the first sentence of its YAML), the
    other config groups, the ten most used overrides and where the docs are. Reads only the YAML files' names and
    first comments: no Hydra, no torch."""
    width = 30
    default = _default_experiment()
    lines = [
        f"{prog}: fine-tune language models with multi-agent RL (CORY, its PPO baseline, GRPO, RLOO, MAFT, ...)",
        "",
        "usage:",
        f"  {prog} [key=value ...]              one run (default: experiment={default})",
        f"  {prog} -m [key=a,b ...]             a sweep: one run per combination of the comma lists",
        f"  {prog} [key=value ...] --cfg job    print the composed config and run nothing",
        f"  {prog} resume=<run folder>          continue a stopped run",
        "",
        "experiments (experiment=<name>):",
    ]
    lines += _options("experiment", width, default)
    lines += ["", "algorithms (algorithm=<name>):"]
    lines += _options("algorithm", width, None)
    lines += ["", "other config groups (<group>=<option>):"]
    for group in ("model", "task", "task/reward", "hardware", "logger", "rollout", "sweep"):
        names = _option_names(group)
        if names:
            lines.append(f"  {group:<{width - 2}}{', '.join(names)}")
    lines += ["", "the ten most used overrides:"]
    column = max(len(override) for override, _ in TEN_OVERRIDES) + 2
    lines += [f"  {override:<{column}}{what}" for override, what in TEN_OVERRIDES]
    lines += ["", "documentation (in the source repository):"]
    lines += [f"  {page:<{width - 2}}{what}" for page, what in DOC_PAGES]
    lines += [
        "",
        f"Hydra's own help (its flags, the whole config): {prog} --hydra-help. Tab completion (bash):",
        '  eval "$(cory-train --shell-completion install=bash)"',
    ]
    return "\n".join(lines)


def _option_names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _options(group: str, width: int, default: str | None) -> list[str]:
    """One line per option of `group`: its name and the first sentence of its YAML's leading comment."""
    lines = []
    for name in _option_names(group):
        what = _first_sentence(CONF_DIR / group / f"{name}.yaml")
        label = f"{name} (default)" if name == default else name
        text = f"  {label:<{width - 2}}{what}"
        lines.append(text if len(text) <= 118 else text[:117].rstrip() + "…")
    return lines


def _first_sentence(path: Path) -> str:
    comment = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            comment.append(line.lstrip("# ").strip())
    text = " ".join(comment)
    end = re.search(r"(?<!\bFigs)(?<!\bFig)(?<!\be\.g)(?<!\bi\.e)\.(\s|$)", text)  # not "paper Figs. 7-10"
    return text[: end.start() + 1] if end else text


def _default_experiment() -> str | None:
    """The experiment `cory/conf/train.yaml`'s defaults list picks."""
    for entry in OmegaConf.load(CONF_DIR / "train.yaml").get("defaults", []):
        if isinstance(entry, DictConfig) and "experiment" in entry:
            return str(entry["experiment"])
    return None
