"""One trained agent of a run as a Hugging Face model folder: `cory-export <run> --out DIR` (`python -m cory.export`).

    cory-export outputs/runs/imdb/cory/2026-12-05_10-00-00 --out exported/llm1   # llm1 of the latest checkpoint
    cory-export RUN --agent llm2 --iteration 40 --out exported/llm2               # llm2 of checkpoints/iter_000040
    cory-export RUN --lora adapter --out exported/llm1-adapter                    # a PEFT adapter, not merged
    cory-export RUN --out DIR model.name_or_path=/data/llama-2-7b-chat             # the base model from elsewhere

`<run>` is a run folder (its latest checkpoint, or `--iteration N`'s) or one of its checkpoint folders; a checkpoint
model artifact downloaded from W&B is such a run folder. The checkpoint is checked whole first (the checksums
recorded at save, as a resume checks them). The agent's weights are loaded the way `cory.evaluate` loads them (the
run's model config, `cory.policy.Backbone`), then written with `save_pretrained`, with the tokenizer:

- full fine-tuning: the whole model;
- LoRA, `--lora merged` (the default): the adapter merged into the base weights, a plain model; a 4-bit run's base
  is loaded in float for it;
- LoRA, `--lora adapter`: PEFT's adapter folder (`adapter_config.json`, `adapter_model.safetensors`) for
  `PeftModel.from_pretrained(base, DIR)`. Its `base_model_name_or_path` is the run's model (a Hub id or a local
  folder); a model built in memory (`model=tiny_gpt2`) has none, so its weights are written to `DIR/base` and the
  adapter points there.

The value heads (PPO's critic) are left out: they are not part of the policy. `DIR/cory_export.json` says what was
exported from where. Trailing `key=value` arguments override the run's resolved config (a local model path, the
device). `DIR` must be new or empty; the folder appears whole or not at all. Expected failures (no checkpoint, an
unknown agent or iteration, a non-empty `--out`) are one `error:` line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from omegaconf import open_dict

from cory import runtime
from cory.checkpoints import ALGORITHM_DIR, read_state, verify_checksums
from cory.config import validate
from cory.errors import ConfigError, entry_point, writing
from cory.evaluate import checkpoint_agents, load_config, resolve_target

EXPORT_INFO = "cory_export.json"
BASE_DIR = "base"
LORA_MODES = ("merged", "adapter")


def find_checkpoint(run: Path, iteration: int | None) -> tuple[Path, Path]:
    """(run folder, checkpoint folder): the checkpoint `run` names, else the run's latest or `iteration`'s."""
    run_dir, checkpoint = resolve_target(run)
    if iteration is not None:
        wanted = run_dir / "checkpoints" / f"iter_{iteration:06d}"
        if checkpoint is not None and checkpoint.resolve() == Path(run).resolve() and checkpoint != wanted:
            raise ConfigError(f"--iteration {iteration} and {run} name two checkpoints; give one of them")
        if not (wanted / "trainer.json").is_file():
            have = sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*") if (p / "trainer.json").is_file())
            raise ConfigError(
                f"--iteration {iteration}: {run_dir} has no checkpoint of that iteration (it has: "
                f"{', '.join(have) or 'none'})"
            )
        checkpoint = wanted
    if checkpoint is None:
        raise ConfigError(
            f"{run_dir} has no checkpoint yet: a run writes one every `save_every` iterations and at its end "
            f"(save_final=true when save_every=0)"
        )
    return run_dir, checkpoint


def export(
    run: Path,
    out: Path,
    agent: str = "llm1",
    iteration: int | None = None,
    lora: str = "merged",
    overrides: list[str] | None = None,
) -> Path:
    """Write `agent` of `run`'s checkpoint to `out` (see the module docstring); returns the checkpoint exported."""
    if lora not in LORA_MODES:
        raise ConfigError(f"--lora {lora}: must be one of {', '.join(LORA_MODES)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder; choose a new one")
    run_dir, checkpoint = find_checkpoint(Path(run), iteration)
    agents = checkpoint_agents(checkpoint)
    if agent not in agents:
        raise ConfigError(
            f"--agent {agent}: {checkpoint} holds no policy of that name (it has: {', '.join(agents) or 'none'})"
        )
    state = read_state(checkpoint)
    verify_checksums(checkpoint, state)  # what is exported is what was saved
    cfg = load_config(run_dir, list(overrides or []))
    lora_run = bool(cfg.model.get("lora", {}).get("enabled", False))
    if lora == "adapter" and not lora_run:
        raise ConfigError(f"--lora adapter: {run_dir} fine-tuned the whole model, it has no adapter to export")
    if cfg.model.get("load_in_4bit"):  # merging and saving need the float base (as QLoRA merges)
        with open_dict(cfg):
            cfg.model.load_in_4bit = False
    validate(cfg)

    from cory.build import build_backbone, load_model

    backbone = build_backbone(cfg.model, runtime.resolve_device(cfg.hardware.device))
    # PEFT writes the adapter named "default" at the top of the folder (others go to a subfolder of their name)
    policy = backbone.policy("default", init_seed=cfg.seed)
    try:
        policy.load_weights(checkpoint / ALGORITHM_DIR / agent)
    except ValueError as err:  # an override named another model than the run's
        raise ConfigError(f"--agent {agent}: {err}; export with the run's own model settings") from None
    model = policy.pretrained_model  # the value head (`policy.v_head`) stays behind
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with writing(tmp):
        tmp.mkdir(parents=True)
        if lora_run and lora == "adapter":
            model.save_pretrained(str(tmp))
            if not model.base_model.model.name_or_path:  # built in memory: no name PEFT could record
                load_model(cfg.model)[0].save_pretrained(str(tmp / BASE_DIR))  # the same weights, loaded anew
                _point_adapter_at(tmp, str((out / BASE_DIR).resolve()))
        else:
            (model.merge_and_unload() if lora_run else model).save_pretrained(str(tmp))
        backbone.tokenizer.save_pretrained(str(tmp))
        info = {
            "run": str(run_dir.resolve()),
            "checkpoint": checkpoint.name,
            "iteration": state["iteration"],
            "agent": agent,
            "weights": ("lora adapter" if lora == "adapter" else "lora merged") if lora_run else "full",
            "run_info": state["run_info"],
        }
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2))
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    return checkpoint


def _point_adapter_at(folder: Path, base: str) -> None:
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


# Ctrl-C at any moment: one line, exit code 130; a refused input or a failed write of --out: one line, exit code 2
@entry_point(write_advice="pass another --out", unnamed="the output folder")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cory-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder (its latest checkpoint) or one of its checkpoint folders")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the run's resolved config")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (new or empty)")
    parser.add_argument("--agent", default="llm1", help="which agent (default llm1; CORY also has llm2)")
    parser.add_argument("--iteration", type=int, default=None, help="the checkpoint of iteration N (default latest)")
    parser.add_argument(
        "--lora", choices=LORA_MODES, default="merged", help="LoRA runs: merge into the base (default) or an adapter"
    )
    args = parser.parse_intermixed_args(argv)  # overrides before or after the options
    checkpoint = export(args.run, args.out, args.agent, args.iteration, args.lora, args.overrides)
    print(f"[cory] {args.agent} of {checkpoint} exported to {args.out}", flush=True)


if __name__ == "__main__":
    main()
