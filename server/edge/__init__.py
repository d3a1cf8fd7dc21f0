"""The HTTP edge: what clients and operators send and get back. Each endpoint is a folder (its request
models in `protocol.py`, bodies and streams in `serving.py`, routes in `routes.py`); `pipeline/` is the
generation every generating endpoint shares (prepare, admit, generate, log), `formats/` the tool-call and
output formats. Domain exceptions become HTTP statuses here and only here (`errors.py`)."""
