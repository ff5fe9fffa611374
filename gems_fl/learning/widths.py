"""Hidden widths of the MLP as a setting (pure Python: the CLI checks settings without torch)."""

from __future__ import annotations


def parse_hidden(spec: str) -> list[int]:
    """``"100,50"`` -> ``[100, 50]``: hidden layer widths of the MLP."""
    try:
        widths = [int(part) for part in str(spec).split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"hidden={spec!r} must be comma-separated positive integers, e.g. '100,50'") from None
    if not widths or any(w < 1 for w in widths):
        raise ValueError(f"hidden={spec!r} must list at least one positive width, e.g. '50'")
    return widths
