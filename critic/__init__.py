"""The critic: a token-level value model (policy backbone + scalar head) with frozen attention
(`value_model`), its update rule, K value steps per policy step (`trainer`), and its cold-start
pre-training (`pretrain`). Builds on the RL core (`liveloop.rl`); knows nothing of serving or of the
learner. Import the submodules; this package stays light (no torch) so configs load fast."""
