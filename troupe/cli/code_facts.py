"""What ``show`` and ``compare`` say of the code a run ran and of the files it kept: the
files its commands ran (sha256, git commit, branch, uncommitted changes), its folder
packs (version, digest), its checkpoints in one line; and between two runs, which file,
commit, diff or pack differs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from troupe.cli.render import size_text

CHECKPOINT_KINDS = ("checkpoint", "training_state")


def code_lines(facts: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(label, text) facts: each command's files and trees, then the folder packs."""
    if not facts:
        return []
    fingerprint = facts.get("fingerprint") or {}
    found: list[tuple[str, str]] = []
    for node_id, record in sorted((fingerprint.get("code") or {}).items()):
        repos = {repo["name"]: repo for repo in record.get("repos") or ()}
        for item in record.get("files") or ():
            text = f"{node_id}: {item['name']}  sha256 {(item.get('sha256') or '-')[:12]}"
            repo = repos.get(item.get("repo") or "")
            if repo is not None:
                text += f"  {_tree(repo)}" + ("" if item.get("tracked", True) else ", the file is not tracked")
            found.append(("Code", text))
    for pack in fingerprint.get("packs") or ():
        if pack.get("source") == "folder":
            digest = (pack.get("digest") or "-")[:12]
            found.append(("Pack", f"{pack['name']} {pack.get('version') or '?'}  digest {digest}"))
    return found


def _tree(repo: Mapping[str, Any]) -> str:
    commit = (repo.get("commit") or "no commit")[:12]
    state = "dirty" if repo.get("dirty") else "clean" if repo.get("dirty") is False else "state unknown"
    diff = f", diff {repo.get('diff_bytes')} B sha256 {repo['diff_sha256'][:12]}" if repo.get("diff_sha256") and \
        repo.get("diff_bytes") else ""
    return f"(git {repo.get('branch') or 'detached'} {commit}, {state}{diff})"


def checkpoint_line(summary: Mapping[str, Any] | None) -> str | None:
    if not summary:
        return None
    text = f"{summary['count']} kept, {size_text(summary['total_size'])}"
    if summary.get("newest"):
        text += f"; newest {summary['newest']['path'].rsplit('/', 1)[-1]}"
    best = summary.get("best")
    if best:
        text += f"; best {best['path'].rsplit('/', 1)[-1]} ({best['series']} {best['value']:.4g})"
    if summary.get("removed"):
        text += f"; {summary['removed']} let go (keep_checkpoints)"
    return text + " (troupe show ID --artifacts lists them)"


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What differs in the code two runs ran, ``theirs`` against ``mine``: each file
    (by its sha256), tree (commit, branch, dirty, diff) and folder pack (version, digest)."""
    found: list[dict[str, Any]] = []
    code_a, code_b = mine.get("code") or {}, theirs.get("code") or {}
    for node_id in sorted(set(code_a) | set(code_b)):
        a, b = code_a.get(node_id) or {}, code_b.get(node_id) or {}
        found += _compared("file", node_id, _by_name(a, "files"), _by_name(b, "files"), ("sha256",))
        found += _compared("tree", node_id, _by_name(a, "repos"), _by_name(b, "repos"),
                           ("commit", "branch", "dirty", "diff_sha256"))
    packs_a = {p["name"]: p for p in mine.get("packs") or () if p.get("source") == "folder"}
    packs_b = {p["name"]: p for p in theirs.get("packs") or () if p.get("source") == "folder"}
    found += _compared("pack", None, packs_a, packs_b, ("version", "digest"))
    return found


def _by_name(record: Mapping[str, Any], part: str) -> dict[str, Mapping[str, Any]]:
    return {item["name"]: item for item in record.get(part) or ()}


def _compared(what: str, node_id: str | None, a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]],
              fields: tuple[str, ...]) -> list[dict[str, Any]]:
    found = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            found.append({"what": what, "node_id": node_id, "name": name, "field": None,
                          "this": name in a, "other": name in b})
            continue
        for field in fields:
            if a[name].get(field) != b[name].get(field):
                found.append({"what": what, "node_id": node_id, "name": name, "field": field,
                              "this": a[name].get(field), "other": b[name].get(field)})
    return found


def difference_text(item: Mapping[str, Any]) -> str:
    where = f"{item['node_id']}: " if item.get("node_id") else ""
    label = {"file": "file", "tree": "git tree", "pack": "pack"}[item["what"]]
    if item["field"] is None:
        return f"{where}{label} {item['name']} is only in {'the first' if item['this'] else 'the second'} run"
    field = {"diff_sha256": "uncommitted diff (sha256)"}.get(item["field"], item["field"])
    return f"{where}{label} {item['name']}: {field} {_short(item['this'])} -> {_short(item['other'])}"


def _short(value: Any) -> str:
    if isinstance(value, str) and len(value) >= 32 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    return "-" if value is None else str(value)
