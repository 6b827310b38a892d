"""Analyses over runs and models: the ETTR model and the SDC coverage campaign."""
