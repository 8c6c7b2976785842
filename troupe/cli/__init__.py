"""The ``troupe`` command line (typer): start, stop, run, exec."""
