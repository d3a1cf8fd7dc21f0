"""The serving side: an OpenAI-compatible server over an `Engine`, logging every response (exact
tokens, behavior logprobs, policy version) to the store and taking feedback. Knows nothing of how
learning works: it meets the learner only in the store. Three rooms:

- `edge/`: the HTTP edge. One folder per endpoint (`protocol.py` request models, `serving.py` bodies
  and streams, `routes.py`), the generation pipeline they share (`pipeline/`), tool and output formats
  (`formats/`), auth, admission, bodies, hosts and the error table.
- `control/`: the version control plane. What serves which version: activation, rollback, candidates
  and the release gate, start-up recovery, forget-to-weights, alarms, leadership. Never imports the edge.
- `engines/`: the `Engine` protocol and its backends, listed once in `engines/registry.py`. Imports
  neither room.

`config.py` is the server's typed settings, shared by the three."""
