"""Everything that executes a graph: the catalog and its packs, validation, the engine,
the execution context, device resolution and seeding.

It never imports the control plane (``actors``, ``web``, ``supervisors``, ``cli``): a run
child and ``troupe exec`` execute graphs with this package alone.
"""
