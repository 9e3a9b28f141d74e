"""Code shared by the test modules, imported as `helpers.<module>` (tests/ is on pytest's `pythonpath`).

`compose` composes configs the way `python -m cory.train` does (`CONF_DIR`, `compose_cfg`) and expands a sweep
command into its jobs; `runners` starts, resumes and inspects runs as a user does (in-process and as
subprocesses) and checks what a finished run folder holds (`check_run_folder`, `read_rows`, `smoke`);
`from_config` builds classes with the composed YAML's values (`learner`, `task_kwargs`, `agent_from`,
`algorithm_from`); `cory_setup` builds a CORY on the smoke model that trains on fixed queries (`make_cory`);
`fakes` writes hand-made IMDB-style reviews and a tiny saved classifier; `maft_fakes` holds the Multiagent
Finetuning doubles (an arithmetic task, `maft_cfg`, a scripted agent pool, a run that pauses at one stage).
Test modules import shared code only from here: never another test module, never conftest.py.
"""
