"""troupe's version: both ends of a wire must run the same one."""

__version__ = "0.1.0"
