"""A run's page in real Chromium (issue 65, sections 3 and 4): a script kept in bounds
shows its checkpoints in one line (how many kept, the newest, the best, how many let
go) with every file behind "All N files", and its environment names the file the
command ran with its sha256."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import MISSING, REASON
from tests.integration.test_checkpoint_bounds_functional import SCRIPT, _command

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect


def test_a_run_page_says_its_checkpoints_in_one_line_and_the_code_it_ran(open_page, tmp_path):
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "epochs.py").write_text(SCRIPT)
    server, tab, errors = open_page(TROUPE_DATA_ROOTS=str(tmp_path))
    run_id = server.submit(_command(folder, 3, "ok", keep_checkpoints=2, keep_best="val_loss"))["run_id"]
    server.wait_status(run_id, "succeeded", timeout=90)
    tab.goto(f"{server.url}/#/runs/{run_id}")
    line = tab.locator("#run-artifacts p.checkpoints")
    expect(line).to_have_text("Checkpoints: 3 kept, 54 B; newest epoch-5.pt; best epoch-2.pt (val_loss 0.2000); "
                              "2 let go (keep_checkpoints)")
    files = tab.locator("#run-artifacts details")
    expect(files.locator("table")).not_to_be_visible()  # on demand
    files.locator("summary").click()
    expect(files.locator("tr.artifact")).to_have_count(3)
    expect(tab.locator("#run-environment")).to_contain_text("train: epochs.py sha256 ")
    assert errors == []
