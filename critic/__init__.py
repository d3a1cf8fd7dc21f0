"""The critic: a token-level value model with frozen attention. Not built yet: see the issue "The
online SAO learner and its critic"."""
