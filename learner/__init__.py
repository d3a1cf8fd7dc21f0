"""The learner: SAO (online, one rated response at a time, with a critic), its baselines, weight
publishing and offline jobs. Not built yet: see the issue "The online SAO learner and its critic"."""
