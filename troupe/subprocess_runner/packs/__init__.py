"""Node packs shipped with troupe. Each module declares one ``PACK``."""
