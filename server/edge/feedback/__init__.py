"""Feedback: ratings, deletions, and the per-version view users may read."""
