"""liveloop: serve a language model, log every response with its behavior logprobs and policy version,
take thumbs up/down, and learn from them online.

This package holds what every component shares (config loading, metrics, the CLI). The components
live in the top-level folders server/, store/, learner/, critic/, clients/ and are installed as
liveloop.server, liveloop.store, ... (see pyproject.toml).
"""

__version__ = "0.1.0"
