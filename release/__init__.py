"""The release gate: how a learner's candidate version reaches users (`[release]`).

Modes (`config.py`), the canary routing rule (`routing.py`), the promotion decision (`decision.py`), the
evaluation suite and its checks (`evaluation.py`), and the reward-hacking attribution's settings. Pure
or torch-only: the server (server/control/gate.py) runs it against the engine and the store.
"""
