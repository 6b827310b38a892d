"""What runs inside the user's process besides :mod:`chaos.agent`: exact bit flips, the in-job tensor fault
engine, the pytorchfi adapter. Imports only :mod:`chaos.events`, plan/spec data and torch."""
