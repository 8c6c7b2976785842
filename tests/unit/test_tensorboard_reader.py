"""The reader of a command's TensorBoard event files and a training loop's writer, driven
directly: a record cut half way (a writer's buffer flushed mid-record) is read once it is
whole, never twice and never as garbage; a file two commands of one run could both see
is read by one; without the tensorboard package each says so once and the run goes on."""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from troupe.subprocess_runner import tensorboard_reader
from troupe.subprocess_runner.tensorboard_reader import TensorBoardFiles, command_folders

needs_tensorboard = pytest.mark.skipif(find_spec("tensorboard") is None,
                                       reason="the tensorboard package is not installed (pip install "
                                              "'troupe[tensorboard]')")


class Ctx:
    node_id = "train"

    def __init__(self, run_dir: Path | None = None) -> None:
        self.points: list[tuple[str, float, int, dict[str, Any]]] = []
        self.warnings: list[tuple[str, str | None]] = []
        self.artifacts: list[tuple[str, Path]] = []
        self.run_dir = run_dir

    def metric(self, name: str, value: float, step: int | None = None, **extra: Any) -> None:
        self.points.append((name, value, step or 0, extra))

    def warning(self, message: str, code: str | None = None) -> None:
        self.warnings.append((message, code))

    def files(self, kind: str) -> Path:
        assert self.run_dir is not None
        folder = self.run_dir / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def artifact(self, kind: str, path: Path) -> None:
        self.artifacts.append((kind, path))


def _event_file(folder: Path, points: list[tuple[int, float]]) -> bytes:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step, value in points:
        writer.add_scalar("loss", value, step)
    writer.close()
    (path,) = folder.glob("*tfevents*")
    data = path.read_bytes()
    path.unlink()
    return data


@needs_tensorboard
def test_a_record_cut_half_way_is_read_once_it_is_whole(tmp_path):
    whole = _event_file(tmp_path / "made", [(1, 0.5), (2, 0.25), (3, 0.125)])
    run_dir = tmp_path / "run"
    own, folders = command_folders(run_dir, run_dir, "train")
    ctx = Ctx()
    files = TensorBoardFiles(ctx, folders)
    target = run_dir / "runs" / "x" / "events.out.tfevents.1.host.1.0"
    target.parent.mkdir(parents=True)
    cuts = [len(whole) // 3, len(whole) // 3 + 5, len(whole) - 3, len(whole)]  # inside records, headers, checksums
    written = 0
    for cut in cuts:
        with target.open("ab") as out:
            out.write(whole[written:cut])
        written = cut
        files.look()
    files.close()
    assert [(name, value, step) for name, value, step, _ in ctx.points] == [("loss", 0.5, 1), ("loss", 0.25, 2),
                                                                            ("loss", 0.125, 3)]
    assert all(isinstance(extra["wall_time"], float) for *_, extra in ctx.points)
    assert ctx.warnings == [] and own == run_dir / "tensorboard" / "train" and own.is_dir()


@needs_tensorboard
def test_two_readers_of_one_folder_chart_a_file_once(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "events.out.tfevents.2.host.1.0").write_bytes(_event_file(tmp_path / "made", [(1, 1.0)]))
    first, second = Ctx(), Ctx()
    readers = [TensorBoardFiles(first, [tmp_path / "runs"]), TensorBoardFiles(second, [tmp_path / "runs"])]
    for reader in readers:
        reader.look()
    for reader in readers:
        reader.close()
    assert len(first.points) + len(second.points) == 1


def test_without_the_package_the_run_says_once_that_its_files_were_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard_reader, "_api", lambda: None)
    (tmp_path / "events.out.tfevents.3.host.1.0").write_bytes(b"\0" * 16)
    ctx = Ctx()
    files = TensorBoardFiles(ctx, [tmp_path])
    for _ in range(3):
        files.look()
    files.close()
    assert ctx.points == []
    assert len(ctx.warnings) == 1 and ctx.warnings[0][1] == "tensorboard_not_read", ctx.warnings
    assert "troupe[tensorboard]" in ctx.warnings[0][0]


def test_no_event_file_asks_for_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard_reader, "_api", lambda: pytest.fail("imported with no event file"))
    ctx = Ctx()
    files = TensorBoardFiles(ctx, [tmp_path, tmp_path / "missing"])
    files.look()
    assert ctx.points == [] and ctx.warnings == []


def test_a_training_loop_without_the_package_says_so_and_trains_on(tmp_path, monkeypatch):
    from troupe.subprocess_runner.packs._torch_board import Board

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # what an import finds when it is missing
    ctx = Ctx(tmp_path)
    assert Board.open(ctx) is None
    assert len(ctx.warnings) == 1 and ctx.warnings[0][1] == "tensorboard_not_written", ctx.warnings
    assert Board.open(Ctx(None)) is None  # no folder of its own (troupe exec): nothing written, nothing said


@needs_tensorboard
def test_a_training_loops_board_announces_its_files_once_closed(tmp_path):
    from troupe.subprocess_runner.packs._torch_board import Board

    ctx = Ctx(tmp_path)
    board = Board.open(ctx)
    assert board is not None
    for epoch in (1, 2):
        board.add("train_loss", 1.0 / epoch, epoch)
        board.epoch_done()
    board.close()
    (kind, path), = ctx.artifacts
    assert kind == "tensorboard" and path.parent == tmp_path / "tensorboard" / "train"
    reader = Ctx()
    files = TensorBoardFiles(reader, [path.parent])
    files.look()
    files.close()
    assert [(name, value, step) for name, value, step, _ in reader.points] == [("train_loss", 1.0, 1),
                                                                              ("train_loss", 0.5, 2)]
