"""The operator side of the edge, behind the admin key: the admin API split by what it acts on
(`versions.py`, `learning.py`, `keys.py`, `fleet.py`; the release gate, alarms and episodes beside
them), each module with its handler and routes, their bodies in `protocol.py` and `views.py`; the
dashboard and the API docs."""
