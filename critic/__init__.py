"""The critic: a token-level value model (policy backbone + scalar head) with frozen attention
(`value_model`), and its update rule, K value steps per policy step (`trainer`). Knows nothing of
serving. Import the submodules; this package stays light (no torch) so configs load fast."""
