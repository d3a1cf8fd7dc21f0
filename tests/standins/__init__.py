"""Stand-ins for servers the tests cannot run here (each module says which server and which of its
endpoints and fields it reproduces)."""
