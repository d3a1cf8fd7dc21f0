"""The presets, grouped by kind, one folder each, every one referred to by its name alone
(`liveloop serve --config production`, `extends = "tuned_learner"`):
- `serve/`: deployment shapes (`default`, `production`, `ray`, `segment_adapters`, `live_swaps`);
- `experiments/`: `liveloop experiment drift|stability|agent` (`drift_experiment`, `drift_long`, ...);
- `scenarios/`: simulated users (`drift`, `sycophancy`: `liveloop simulate --scenario NAME`);
- `jobs/`: batch jobs (`bgpo`); `suites/`: the release gate's evaluation suites (`evaluation_default`);
- `fragments/`: pieces the others extend, never copied (`tuned_learner`, `step_control`,
  `adapter_learning`, `feedback_delay`).
This folder installs as the package data of `liveloop.configs` (pyproject.toml), so a preset is found
by name the same way from a checkout, an editable install and an installed wheel
(`liveloop.config.CONFIG_DIR`, looked up with importlib.resources). It holds no code.
"""
