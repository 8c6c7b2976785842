"""The environment fingerprint (schema 2): what executed a run, taken by the process that
executed it (the server for its own runs, the run's child on a worker, so a worker whose
checkout changed after its agent started is seen). Equal digests mean equal
environments. Nothing here imports torch: its build and CUDA version are read from its
installed files."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import platform
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from troupe.protocol.settings import FINGERPRINT_ENV
from troupe.protocol.version import __version__
from troupe.subprocess_runner import pack_watch
from troupe.subprocess_runner.catalog import load_catalog
from troupe.subprocess_runner.devices import probe_accelerators
from troupe.subprocess_runner.seeding import process_env

SCHEMA = 2
CONTROL_PLANE, RUN_PROCESS = "control_plane", "run_process"
_REPO = Path(__file__).resolve().parents[2]


def execution_facts(source: str, folder_packs: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """``{fingerprint, fingerprint_digest, fingerprint_source}`` of this process: its code
    and libraries do not change while it lives, so the facts are taken once for each
    value of the variables it records (a warm child takes them for a CPU run's before
    its run comes). ``folder_packs``: the packs loaded from folders that the run uses,
    (name, sha256 of its files): user code that is part of what executed it."""
    return _facts(source, folder_packs, tuple(process_env(FINGERPRINT_ENV).items()))


def take_ahead(source: str, changes: Mapping[str, str]) -> None:
    """Takes the facts a run of this process will have once it has set ``changes`` (a
    warm child, before its run comes), leaving the environment as it is: a child must
    not change what CUDA would read before the run chose its cards."""
    env = process_env(FINGERPRINT_ENV)
    env.update((name, value) for name, value in changes.items() if name in env)
    _facts(source, (), tuple(env.items()))


@functools.lru_cache(maxsize=64)
def _facts(source: str, folder_packs: tuple[tuple[str, str], ...],
           env: tuple[tuple[str, str | None], ...]) -> dict[str, Any]:
    values = dict(env)
    found = {**static_facts(), "accelerators": list(probe_accelerators(values["CUDA_VISIBLE_DEVICES"])),
             "env": values}
    found["packs"] = [*found["packs"], *({"name": name, "version": pack_watch.version_of(digest), "digest": digest,
                                          "source": "folder"} for name, digest in folder_packs)]
    return {"fingerprint": found, "fingerprint_digest": digest_of(found), "fingerprint_source": source}


def digest_of(fingerprint: Mapping[str, Any]) -> str:
    """Equal digests: equal fingerprints (the code a command ran included)."""
    body = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def with_code(facts: Mapping[str, Any], node_id: str, code: Mapping[str, Any]) -> dict[str, Any]:
    """The run's facts with the code a command node ran (``code_record``) in its
    fingerprint (``fingerprint.code.<node id>``), and the digest taken again over both:
    two runs of an edited script differ."""
    found = {**facts["fingerprint"], "code": {**(facts["fingerprint"].get("code") or {}),
                                              node_id: {"files": list(code.get("files") or ()),
                                                        "repos": list(code.get("repos") or ())}}}
    return {**facts, "fingerprint": found, "fingerprint_digest": digest_of(found)}


def with_pack_versions(facts: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's facts with the version of each folder pack the server loaded at that
    digest (the run's child takes its facts before it loads its packs, so it names them
    by digest alone), and the digest taken again."""
    fingerprint = facts.get("fingerprint")
    if not isinstance(fingerprint, dict) or not isinstance(fingerprint.get("packs"), list):
        return dict(facts)
    packs = [{**pack, "version": pack_watch.version_of(str(pack.get("digest")))}
             if isinstance(pack, dict) and pack.get("source") == "folder" and pack.get("version") is None else pack
             for pack in fingerprint["packs"]]
    if packs == fingerprint["packs"]:
        return dict(facts)
    found = {**fingerprint, "packs": packs}
    return {**facts, "fingerprint": found, "fingerprint_digest": digest_of(found)}


@functools.lru_cache(maxsize=1)
def static_facts() -> dict[str, Any]:
    """What cannot change while this process lives (its code and its libraries). A warm
    child takes them before it waits for a run: the code it imported then is the code
    that executes, even if the checkout changes meanwhile."""
    catalog = load_catalog()
    return {
        "schema": SCHEMA,
        "troupe": {"version": __version__, "commit": _commit()},
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "torch": {"version": _version("torch"), "cuda": _torch_cuda()},
        "packs": [{"name": name, "version": version, "digest": _digest(modules)}
                  for name, (version, modules) in sorted(catalog.pack_sources.items())],
    }


def _commit() -> str | None:
    """The checkout's commit, read from .git without running git."""
    git = _REPO / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head.removeprefix("ref: ")
        if (git / ref).exists():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split()[0]
    except OSError:
        pass
    return None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _torch_cuda() -> str | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]?([^'\"\n]+)['\"]?", text, re.MULTILINE)
    return None if found is None or found.group(1) == "None" else found.group(1)


def _digest(modules: tuple[str, ...]) -> str | None:
    """The content of a pack's code: its modules' source files, found without importing them."""
    digest = hashlib.sha256()
    for name in _with_helpers(modules):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None or not Path(spec.origin).is_file():
            digest.update(f"{name}:missing".encode())
            continue
        digest.update(name.encode())
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def _with_helpers(modules: tuple[str, ...]) -> list[str]:
    """The named modules and their private helpers: a node's code in ``pkg._torch_train``
    also lives in ``pkg._torch_epoch``, ``pkg._torch_data``..., the siblings that share
    its ``_torch_`` prefix, so an edit to any of them changes the pack's digest."""
    found = dict.fromkeys(modules)
    for name in modules:
        package, _, leaf = name.rpartition(".")
        prefix = leaf[: leaf.find("_", 1) + 1] if leaf.startswith("_") else ""
        if not package or len(prefix) < 3:
            continue
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            for path in sorted(Path(folder).glob(f"{prefix}*.py")):
                found.setdefault(f"{package}.{path.stem}")
    return sorted(found)
