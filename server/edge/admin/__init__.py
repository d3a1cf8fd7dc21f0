"""The operator side of the edge: the admin API, the release and alarm views, episodes, the dashboard
and the API docs, all behind the admin key."""
