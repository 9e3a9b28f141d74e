"""The study tools: what turns finished runs into figures, tables and verdicts, and the resumable sweep driver.

Installed commands (`[project.scripts]` in pyproject.toml), each also `python -m cory.studies.<module>`:

    cory-plot curves | frontier              plot_curves.py, plot_frontier.py   (figures over seeds, the KL frontier)
    cory-report claim | claim2 | family | paired
                                             claim_report.py, claim2_report.py, family_report.py, paired_test.py
    cory-measure reward-spread | stop-latency reward_spread.py, stop_latency.py
    cory-sweep                               run_sweep.py   (one machine, resumable, each job in a fixed folder)
    cory-gpt2-small                          make_gpt2_small.py   (the GPT-2-small-shaped model of the benchmark)

Underneath them:
- `results.py`: the one reader of run folders and of the results kept from them (summary.json, metrics.jsonl,
  run_config.yaml, overrides, passk.json, MAFT's per-problem outcomes, a sweep's `--results` folders, W&B summaries),
  checking what it reads;
- `stats.py`: the statistics (spreads over seeds, t, geometric-mean and Welch intervals, the seeds an interval's
  width needs, the paired test and McNemar's exact test);
- `command.py`: the error boundary every command runs in (expected failures are one `error:` line and exit code 2,
  Ctrl-C exit code 130, a bug keeps its traceback), the argument parser, the sub-command dispatch.
The figures themselves are drawn by `cory.figures`, `cory.plotting` and `cory.frontier`, shared with the runs.

This package is the top layer (pyproject.toml's import contract): it reads run folders and may import any of cory;
nothing in cory imports it.
"""
