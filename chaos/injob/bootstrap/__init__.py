"""The zero-line step reporter's folder (put first on a job's PYTHONPATH: see its sitecustomize)."""

from pathlib import Path

BOOTSTRAP_DIR = Path(__file__).resolve().parent
