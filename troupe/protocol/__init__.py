"""Everything two processes must agree on: graph documents, the event vocabulary,
request and reply schemas, error codes and setting names.

This package imports nothing else of troupe's, so both ends of every wire (the control
plane, the CLI, a run child, later a worker agent) can depend on it.
"""
