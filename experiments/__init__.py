"""Experiments run through the real system: the preference-drift experiment (simulated users,
SAO against its baselines, reports and plots)."""
