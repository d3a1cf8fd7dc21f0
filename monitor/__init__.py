"""Preference-drift monitoring over the feedback stream: reward rates with confidence intervals, change
detectors, per-version comparisons."""
