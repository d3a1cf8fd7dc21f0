"""The presets: one TOML file per deployment shape, job or scenario (`default.toml`, `production.toml`,
`bgpo.toml`, `drift.toml`, ...), referred to by name (`liveloop serve --config production`).

This folder installs as the package data of `liveloop.configs` (pyproject.toml), so a preset is found
by name the same way from a checkout, an editable install and an installed wheel
(`liveloop.config.CONFIG_DIR`, looked up with importlib.resources). It holds no code.
"""
