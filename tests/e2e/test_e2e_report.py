"""The HTML report of a real kill-rank run (the session's shared one): every check with its evidence, the
replay line, the verdict, the fired plan op, and a full-width timeline."""

from __future__ import annotations

import json

import pytest
from support import parsed, png_size, timeline_png

from chaos.report.html import write_html_report
from chaos.run.result import RunResult


@pytest.mark.slow
def test_report_of_a_real_kill_rank_run(kill_rank_run: RunResult) -> None:
    result = kill_rank_run  # (shared with test_e2e_training, which checks the run itself)
    run = json.loads((result.run_dir / "run.json").read_text(encoding="utf-8"))
    path = write_html_report(result.run_dir)
    page_text = path.read_text(encoding="utf-8")
    page = parsed(page_text)
    text = page.all_text
    png = timeline_png(page)
    assert png_size(png)[0] >= 1000
    assert len(run["checks"]) >= 6
    for c in run["checks"]:
        assert c["name"] in text
        for line in c["evidence"]:
            assert line in text
    assert run["replay"] in text and f"--seed {run['seed']}" in text and str(run["seed"]) in text
    assert f'class="verdict {run["verdict"]}">{run["verdict"].upper()}</span>' in page_text
    assert "kill-rank1#1" in text and "applied +" in text  # the plan op, and that it fired
