"""The one rule for "good enough": validation accuracy ``>= eps``, decided on counts.

Every radius search, certified radius and membership check decides "accuracy >= eps"
through :func:`pass_count`, so that all of them agree on the boundary case where
``eps * N`` is an integer (``0.7 * 10`` is ``7.000000000000001`` in floating point).
"""

from __future__ import annotations

import math


def check_eps(eps: float) -> float:
    """``eps`` as a float in ``[0, 1]`` (the minimum accuracy), else ``ValueError``."""
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"eps is the minimum accuracy, a number in [0, 1]; got {eps!r}") from None
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps is the minimum accuracy, in [0, 1]; got {eps}")
    return eps


def pass_count(eps: float, num: int) -> int:
    """Smallest number of correct samples ``k`` out of ``num`` with ``k / num >= eps``.

    Computed with the same float division the accuracies use, so that "accuracy >= eps"
    and "correct count >= pass_count" agree exactly (``0.7 * 10`` is ``7.000000000000001``
    in floating point, so ``ceil(eps * num)`` alone can be off by one).
    """
    k = min(max(math.ceil(eps * num), 0), num + 1)
    while k > 0 and (k - 1) / num >= eps:
        k -= 1
    while k <= num and k / num < eps:
        k += 1
    return k



def passes(num_correct: int, num: int, eps: float) -> bool:
    """Whether ``num_correct`` correct out of ``num`` is good enough (accuracy >= eps)."""
    return int(num_correct) >= pass_count(eps, num)


def zero_radius_reason(accuracy: float, eps: float | None, *, unscaled: bool = False) -> str:
    """Why a node's space is the single point of its model (radius 0), in words: its
    model fails its ``eps``, or it passes but every radius the search tried let some
    sampled model fall below (few validation rows leave no room: with one row, one
    mistake is accuracy 0). ``unscaled``: the node's features were not scaled (own
    files with ``standardize='off'``), the first thing to fix for a failing model."""
    if eps is None:
        return f"its own model has validation accuracy {accuracy:.3f} (its eps not reported)"
    if accuracy < eps and unscaled:
        return (f"its own model has validation accuracy {accuracy:.3f} < its eps={eps}, on "
                "features that were not scaled: standardize='federated' (or files scaled "
                "beforehand) usually lets it train; else lower eps")
    if accuracy < eps:
        return (f"its own model has validation accuracy {accuracy:.3f} < its eps={eps}; "
                "lower eps to give it room")
    return (f"its own model passes its eps={eps} (validation accuracy {accuracy:.3f}) but "
            "at every radius the search tried some sampled model fell below it; more "
            "validation rows or a lower eps give it room")
