"""The version control plane: what serves which version, decided once and recorded in the store.
Activation and rollback (`activator.py`), the release gate and its candidates, start-up recovery,
forget-to-weights, the reward-hacking alarms, the drift monitor loop and the leader lease. It raises
domain exceptions and never imports the HTTP edge."""
