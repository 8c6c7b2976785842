"""The parts of a run's answers about what it ran and what it kept: the code a command
ran (in its fingerprint, ``fingerprint.code``) and the summary of its checkpoints
(``GET /api/runs/{id}``'s ``checkpoints``). Named models, as ``replies_runs``' are, so
the OpenAPI document gives each a type; open to fields they do not name. Imports
nothing of ours."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class CodeFile(_Reply):
    """A file an argv item of a command named, as it was when the command started."""

    name: str = Field(description="as argv named it (train.py)")
    path: str = Field(description="where it was, on the machine that ran it")
    size: int | None = None
    sha256: str | None = Field(description="null: not read (see note)")
    repo: str | None = Field(default=None, description="the git work tree it lies in (a repos entry's name)")
    tracked: bool | None = Field(default=None, description="whether git tracks the file (false: not in the commit)")
    note: str | None = None


class CodeRepo(_Reply):
    """A git work tree a command's files lie in: its commit and branch, whether it had
    uncommitted changes, and those changes (the first 64 KiB, with the digest of all)."""

    name: str = Field(description="the work tree's folder")
    commit: str | None = Field(description="null: a tree with no commit yet")
    branch: str | None = Field(description="null: a detached HEAD")
    dirty: bool | None = Field(description="tracked files changed since the commit")
    diff: str | None = Field(default=None, description="git diff HEAD, cut at 64 KiB (diff_cut)")
    diff_sha256: str | None = Field(default=None, description="of the whole diff")
    diff_bytes: int | None = None
    diff_cut: bool | None = None
    note: str | None = Field(default=None, description="what git could not say, and why")


class CodeRecord(_Reply):
    """The code one command node ran."""

    files: list[CodeFile]
    repos: list[CodeRepo]


class CheckpointRef(_Reply):
    id: int = Field(description="the artifact's id (GET /api/runs/{id}/artifacts/{artifact_id})")
    path: str
    node_id: str | None
    size: int | None
    epoch: int | None = Field(description="the last number in its name")


class CheckpointBest(CheckpointRef):
    series: str
    value: float
    lower_is_better: bool


class CheckpointSummary(_Reply):
    """A run's checkpoints in a few words: how many it keeps and their size, the newest
    (a resume's), the best by a node's keep_best series, and how many it let go."""

    count: int = Field(description="checkpoint files kept (stored or on their way)")
    total_size: int = Field(description="bytes of those and of their training states")
    newest: CheckpointRef | None
    best: CheckpointBest | None = Field(description="by the keep_best series of its node; null without one")
    removed: int = Field(description="checkpoints let go past keep_checkpoints / keep_best")
