"""``mlchaos sdc-coverage``: the SDC coverage campaign from the command line (see :mod:`chaos.analysis.sdc_coverage`).

``register(app)`` adds the command to the main Typer app. Without options it runs the acceptance
configuration (float32, 25 MB buckets, sign and exponent bits, in_transit and post_reduce, 1000 clean
reductions; ~6 min on 2 cores); ``--quick`` runs the whole matrix small (1 MB buckets, every bit, site and
dtype, a few trials per cell; ~1 min). Any option given overrides the chosen preset.
Exit code 0 when the run's acceptance criterion passed or did not apply, 1 when it applied and failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# chaos.analysis.sdc_coverage imports torch; it is imported when the command runs, so `mlchaos validate` stays fast.
DETECTOR_NAMES = "none, anomaly, checksum, global"


def register(app: typer.Typer) -> None:
    """Add the ``sdc-coverage`` command to ``app``."""
    app.command("sdc-coverage")(sdc_coverage)


def sdc_coverage(
    out: Annotated[Path, typer.Option(help="folder for coverage.json and coverage.png")] = Path("reports/sdc-coverage"),
    quick: Annotated[bool, typer.Option(help="the whole matrix, small and fast (~1 min)")] = False,
    dtype: Annotated[list[str] | None, typer.Option(help="float32, bfloat16, float16 (repeatable)")] = None,  # noqa: UP007
    site: Annotated[list[str] | None, typer.Option(help="local, in_transit, post_reduce (repeatable)")] = None,  # noqa: UP007
    detector: Annotated[list[str] | None, typer.Option(help=f"{DETECTOR_NAMES} (repeatable)")] = None,  # noqa: UP007
    bits: Annotated[str | None, typer.Option(help="all, classes (sign,exponent,mantissa) or indices (0,23,31)")] = None,  # noqa: UP007
    bucket_mb: Annotated[float | None, typer.Option(help="bucket size in MB")] = None,  # noqa: UP007
    trials: Annotated[int | None, typer.Option(min=1, help="trials per (dtype, site, bit)")] = None,  # noqa: UP007
    clean: Annotated[int | None, typer.Option(min=0, help="fault-free reductions for the false-positive count")] = None,  # noqa: UP007
    magnitude: Annotated[str | None, typer.Option(help="rms (flip elements with |x| >= RMS) or any")] = None,  # noqa: UP007
    seed: Annotated[int, typer.Option(help="seed of data and flips")] = 0,
) -> None:
    """Inject single-bit flips into all-reduces (one long-lived gloo group) and measure what each detector catches."""
    from chaos.analysis.sdc_coverage import CampaignConfig, format_summary, run_campaign

    quick_config = CampaignConfig(
        bucket_mb=1.0,
        dtypes=("float32", "bfloat16", "float16"),
        sites=("local", "in_transit", "post_reduce"),
        bits="all",
        trials_per_cell=4,
        clean_reductions=200,
    )
    base = quick_config if quick else CampaignConfig()
    try:
        cfg = CampaignConfig(
            world_size=base.world_size,
            bucket_mb=bucket_mb if bucket_mb is not None else base.bucket_mb,
            dtypes=tuple(dtype) if dtype else base.dtypes,
            sites=tuple(site) if site else base.sites,
            bits=bits if bits is not None else base.bits,
            detectors=tuple(detector) if detector else base.detectors,
            trials_per_cell=trials if trials is not None else base.trials_per_cell,
            clean_reductions=clean if clean is not None else base.clean_reductions,
            magnitude=magnitude if magnitude is not None else base.magnitude,  # type: ignore[arg-type]
            seed=seed,
        )
        if cfg.magnitude not in ("rms", "any"):
            raise ValueError(f"magnitude must be rms or any, got {cfg.magnitude!r}")
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    result = run_campaign(cfg, out_dir=out, progress=typer.echo)
    typer.echo(format_summary(result))
    acc = result.acceptance
    typer.echo(
        f"clean reductions: {result.clean['reductions']}, checksum false positives: {result.clean['checksum_flagged']}"
    )
    if acc["applicable"]:
        rate = acc["detected_rate"]
        typer.echo(
            f"acceptance: {acc['detected']}/{acc['trials']} float32 sign/exponent flips detected"
            f" ({100 * rate:.2f}%) -> {'PASS' if acc['passed'] else 'FAIL'}"
        )
    typer.echo(f"wrote {result.json_path} and {result.png_path} in {result.runtime_s:.0f} s")
    if acc["applicable"] and not acc["passed"]:
        raise typer.Exit(1)
