"""A folder pack is a user's code, and whatever it does after its import is caught too:
a module attribute that raises when read, a ``PACK`` that is not one, a param default
that is not a JSON value, a file name that is not UTF-8. Each is listed as broken with
its reason; the packs beside it load, and the catalog still turns into JSON (what
``GET /api/nodes`` and the editor's palette send)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from troupe.subprocess_runner.catalog import load_catalog, with_folder_packs
from troupe.subprocess_runner.pack_probe import ImportLimits

GOOD = "from troupe import node\n\n@node\ndef half(x: float) -> float:\n    return x / 2\n"
BROKEN = {
    "proxy.py": GOOD + "class _Proxy:\n    def __getattr__(self, name):\n        raise RuntimeError('outside of "
                "context')\n\nrequest = _Proxy()\n",
    "longway.py": "from troupe.subprocess_runner.node_types import Pack\nPACK = Pack('longway', ('oops',))\n",
    "pathdefault.py": "from pathlib import Path\nfrom troupe import node\n\n@node\ndef load(x: float, root: str = "
                      "Path('data')) -> float:\n    return x\n",
    "versioned.py": GOOD + "class _Version:\n    def __str__(self):\n        raise ValueError('no version')\n\n"
                    "__version__ = _Version()\n",
}


def test_what_a_pack_does_after_its_import_lists_it_as_broken_and_the_rest_loads(tmp_path: Path) -> None:
    for name, source in BROKEN.items():
        (tmp_path / name).write_text(source)
    (tmp_path / "good.py").write_text(GOOD)
    latin = tmp_path / "latin"
    latin.mkdir()
    (latin / "__init__.py").write_text(GOOD)
    (latin / os.fsdecode(b"caf\xe9.txt")).write_text("data")

    catalog = with_folder_packs(load_catalog(), sorted(tmp_path.iterdir()))

    assert "good.half" in catalog.types
    assert set(catalog.broken_packs) == {"latin", "longway", "pathdefault", "proxy", "versioned"}
    assert "RuntimeError: outside of context" in catalog.broken_packs["proxy"]
    assert "AttributeError" in catalog.broken_packs["longway"]
    assert "param root: its default PosixPath('data') is not a JSON value" in catalog.broken_packs["pathdefault"]
    assert "ValueError: no version" in catalog.broken_packs["versioned"]
    assert "is not UTF-8; rename it" in catalog.broken_packs["latin"]
    json.dumps(catalog.to_json())


def test_checked_first_in_a_child_a_pack_is_listed_with_the_same_reason_and_one_that_ends_its_process_too(
        tmp_path: Path) -> None:
    for name, source in BROKEN.items():
        (tmp_path / name).write_text(source)
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "quits.py").write_text("import os\n\nos._exit(3)\n")  # in this process: the end of it
    (tmp_path / "crashes.py").write_text("import ctypes\n\nctypes.string_at(0)\n")
    paths = sorted(tmp_path.iterdir())

    checked = with_folder_packs(load_catalog(), paths, ImportLimits(timeout_s=60, memory_mib=2048))

    assert "good.half" in checked.types
    in_process = with_folder_packs(load_catalog(), [path for path in paths if path.name in BROKEN])
    assert {k: v for k, v in checked.broken_packs.items() if k in in_process.broken_packs} == in_process.broken_packs
    assert checked.broken_packs["quits"] == "its import ended the process that imported it (exit status 3)"
    assert checked.broken_packs["crashes"].startswith("its import ended the process that imported it (signal "
                                                      "SIGSEGV); if it needs more than 2048 MiB")
