"""The HTTP edge: what clients and operators send and get back. Each endpoint family is a folder (its
request models in `protocol.py`, its handler, prepare and bodies in `serving.py` or `stored.py`, its
routes in `routes.py`); every route takes its one handler (`dependencies.py`), built by the composition
root with what it uses. `pipeline/` is the generation every generating endpoint shares (admit,
generate, log), `formats/` the tool-call and output formats, `ownership.py` what a key may read and
delete of its responses, `principal.py` who a key is. Domain exceptions become HTTP statuses here and
only here (`errors.py`)."""
