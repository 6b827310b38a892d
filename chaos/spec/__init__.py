"""The scenario as typed, frozen data: YAML loading with file:line:column, the JSON Schema, durations and
URLs, and the typed configuration blocks a scenario embeds (load, serving stack). The bottom of the data flow:
imports nothing from mlchaos but :mod:`chaos.plugins` (to type each fault's params) and :mod:`chaos.history`."""
