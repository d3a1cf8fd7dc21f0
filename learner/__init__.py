"""The learner: SAO's loss and advantage math (`losses`, `advantages`: pure functions of tensors).
The online loop, weight publishing, Ray actor and offline jobs come with the rest of the issue
"The online SAO learner and its critic"."""
