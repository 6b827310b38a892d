"""Pre-0.2 path, kept until 0.3 (``chaos.MOVED_MODULES``): a proxy of its new module, with a DeprecationWarning."""

__import__("chaos").become_moved(__name__)
