"""SDC coverage campaign: a tiny real campaign (one gloo group) writes JSON and a heatmap with all 3 classes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from chaos.analysis.sdc_coverage import CampaignConfig, bit_list, format_summary, run_campaign
from chaos.cli.sdc import register


def test_tiny_campaign_writes_json_and_png_with_every_outcome(tmp_path: Path) -> None:
    cfg = CampaignConfig(
        bucket_mb=0.0625,  # 64 KB
        dtypes=("float32", "bfloat16"),
        sites=("local", "in_transit", "post_reduce"),
        bits="0,1,12,23,30,31",
        trials_per_cell=6,
        clean_reductions=40,
        magnitude="any",  # small elements too, so some flips are rounded away (masked)
    )
    lines: list[str] = []
    start = time.monotonic()
    result = run_campaign(cfg, out_dir=tmp_path, progress=lines.append)
    assert time.monotonic() - start < 60
    assert lines and any("trial" in line for line in lines)
    doc = json.loads((tmp_path / "coverage.json").read_text())
    png = (tmp_path / "coverage.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    cells = doc["cells"]
    # bfloat16 has no bit 23, 30 or 31: the spec is filtered per dtype
    assert {c["bit"] for c in cells if c["dtype"] == "bfloat16"} == {0, 1, 12}
    assert {c["detector"] for c in cells} == {"none", "anomaly", "checksum", "global"}
    assert all(c["trials"] == c["masked"] + c["detected"] + c["silent"] == 6 for c in cells)
    assert sum(c["masked"] for c in cells) > 0
    assert sum(c["detected"] for c in cells) > 0
    assert sum(c["silent"] for c in cells) > 0
    by = {(c["dtype"], c["site"], c["bit"], c["detector"]): c for c in cells}
    # Bit 30 of any |x| < 2 multiplies it by 2^128: the checksum guard catches every one in transit and after
    # the reduction, and its retry repairs it; nobody flags anything without a detector.
    for site in ("in_transit", "post_reduce"):
        assert by[("float32", site, 30, "checksum")]["detected"] == 6
        assert by[("float32", site, 30, "checksum")]["repaired"] == 6
        assert by[("float32", site, 30, "none")]["detected"] == 0
    # A local fault is checksummed faithfully: invisible to the checksum guard, a blow-up for the anomaly guard.
    assert by[("float32", "local", 30, "checksum")]["detected"] == 0
    assert by[("float32", "local", 30, "anomaly")]["detected"] == 6
    assert doc["clean"]["reductions"] == 40 and doc["clean"]["checksum_flagged"] == 0
    assert doc["acceptance"]["applicable"] is False  # 64 KB and 40 clean reductions are not the bar
    assert "checksum" in format_summary(result)


def test_bit_specs() -> None:
    assert bit_list("sign,exponent", torch.float32) == list(range(23, 32))
    assert bit_list("all", torch.bfloat16) == list(range(16))
    assert bit_list("mantissa,15", torch.float16) == [*range(10), 15]
    with pytest.raises(ValueError, match="bad bit spec"):
        bit_list("32", torch.float32)
    with pytest.raises(ValueError, match="sites"):
        CampaignConfig(sites=("wire",))


def test_cli_command_is_registered_and_runs(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)

    @app.command()
    def other() -> None:  # a second command, so typer keeps sub-command names as in the real CLI
        """Placeholder."""

    runner = CliRunner()
    assert "sdc-coverage" in runner.invoke(app, ["--help"]).output
    args = [
        "sdc-coverage",
        "--out",
        str(tmp_path),
        "--bucket-mb",
        "0.0625",
        "--dtype",
        "float32",
        "--site",
        "in_transit",
    ]
    result = runner.invoke(app, [*args, "--bits", "30,31", "--trials", "2", "--clean", "5"])
    assert result.exit_code == 0, result.output
    assert "float32   in_transit" in result.output
    assert (tmp_path / "coverage.json").exists() and (tmp_path / "coverage.png").exists()
