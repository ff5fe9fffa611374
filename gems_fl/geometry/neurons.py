"""Good-enough radius search for every hidden neuron of one layer (paper section 3.2).

Hidden layer ``j`` computes ``relu(Z W^T + b)`` on its inputs ``Z`` (``N`` validation
samples, ``d_in`` features). Neuron ``h`` owns the parameter vector ``w_h = [W_h ; b_h]``
of length ``D = d_in + 1``. A perturbed neuron ``w_h + r u`` (``u`` a unit direction) is
*good enough* (``Q_neuron = 1``) when its outputs on the ``N`` inputs stay close to the
original ones::

    dev(r, u) = norm(relu(a + r s) - relu(a)) / denom <= eps_j
    a = Za w_h,   s = Za u,   Za = [Z, 1]

with ``denom = sqrt(N)`` for ``criterion="rms"`` (root-mean-square deviation, the
default: a per-sample output change, so one ``eps_j`` means the same on nodes with
different numbers of validation samples) and ``denom = N`` for ``criterion="paper"``
(the paper's eq. 3 and the authors' code, whose tolerance grows with ``sqrt(N)``: the
paper criterion at ``eps`` is exactly the rms criterion at ``eps * sqrt(N)``).

Why one bisection per neuron is exact per direction: for ``r >= 0`` every term
``|relu(a_n + r s_n) - relu(a_n)|`` is nondecreasing in ``r``, so ``dev(., u)`` is
monotone and the set of good radii along ``u`` is an interval ``[0, r*(u)]``. A neuron
passes at ``r`` iff all its ``p`` directions pass, which is again an interval, so the
bisection (test ``r_max`` first, then halve ``[lower, upper]`` down to width ``delta``)
returns the largest tested radius below the sampled critical radius.

How the work is batched
-----------------------
* Directions: ``p`` independent unit directions per neuron, ``(H, p, D)``, drawn once
  per search from ``torch.Generator().manual_seed(seed)`` (:func:`neuron_directions`
  returns exactly these). The search never normalises them: it keeps the raw Gaussian
  draws ``g`` and folds ``1 / ||g||`` into the radius (``r u = (r / ||g||) g``).
* One matrix product ``S = G @ Za^T`` of shape ``(H p, N)`` (the transpose of
  ``Za @ U^T``) gives every slope ``s`` of every neuron along every direction; row
  ``h p + k`` only involves neuron ``h``'s own direction ``k``. ``a = Z W^T + b`` is
  computed once.
* With ``c = min(a, 0)`` and ``m = -relu(a)`` (precomputed), the output change is
  ``relu(a + r s) - relu(a) = max(r s + c, m)``: per element one fused multiply-add, one
  max and a square-sum (``addcmul``, ``maximum``, ``vector_norm``), all in place on a
  ``(neurons, chunk, N)`` buffer small enough to stay in cache.
* Each bisection step tests every undecided neuron at its own midpoint. A neuron fails
  as soon as one direction fails, so each step first re-tests every neuron's *witness*
  (the direction that deviated most the last time its directions were evaluated, which
  made it fail if it failed), then evaluates the remaining neurons block by block over
  directions, dropping each neuron at its first failing block. A pass is always
  certified on all ``p`` directions. Most tests of a bisection from ``r_max`` down to a
  small radius fail, so most steps cost one direction per neuron.

Threads
-------
The matrix product runs on torch's intra-op threads. The bisection is a stream of
small ops on cache-sized blocks; callers run it on one thread (``learning.threads.single_thread``): a
second thread gains little there, and when the cores were shared with other processes
OpenMP's barriers made it 8-40x slower on a 2-core machine.

Floating point
--------------
The default ``dtype=torch.float32`` roughly halves the cost of the matrix product (the
dominant cost) and of the per-step passes compared with float64. Every pass/fail decision is taken on the float32
deviations, upcast to float64 and compared with ``eps`` (so no rounding of ``eps`` to
float32). The returned radius is one that the search itself tested and passed with that
arithmetic; ``max_deviation_at_radius`` are those very numbers (``<= eps``).
:func:`neuron_deviations` runs the same kernel (same dtype, same direction handling:
directions are normalised internally by ``1 / ||u||`` folded into the radius), so
``neuron_deviations(..., neuron_directions(..., normalize=False), radii)`` re-checks the
guarantee with the search's arithmetic. Re-evaluating in float64 can differ by float32
rounding (relative ~1e-6); pass ``dtype=torch.float64`` to search in float64 instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gems_fl.geometry.checks import check_option, check_scalar

CRITERIA = ("rms", "paper")
DTYPES = (torch.float32, torch.float64)

# Rows (neuron-direction pairs) per call to the random generator. It fixes the random
# stream (the search and :func:`neuron_directions` draw the same blocks) and bounds the
# memory of the raw draws: each block is multiplied, then its buffer is refilled.
_DRAW_BLOCK = 4096

# Default size of the ``(neurons, chunk, N)`` work buffer, in bytes.
_CHUNK_BYTES = 2 << 20


@dataclass(frozen=True)
class NeuronSearch:
    """The settings of one per-neuron radius search (:func:`neuron_radii`), validated.

    Attributes
    ----------
    eps : tolerance ``eps_j > 0`` on the output deviation.
    num_directions : ``p``, directions per neuron (independent across neurons).
    r_max, delta : bisection range ``[0, r_max]`` and stopping width (both > 0).
    seed : seeds the directions (see :func:`neuron_directions`).
    criterion : ``"rms"`` (default) or ``"paper"`` (see the module docstring).
    """

    eps: float
    num_directions: int
    r_max: float
    delta: float
    seed: int
    criterion: str = "rms"

    def __post_init__(self) -> None:
        checked = {
            "eps": check_scalar(self.eps, "eps", float, low=0, closed="neither"),
            "num_directions": check_scalar(self.num_directions, "num_directions", int,
                                           low=1),
            "r_max": check_scalar(self.r_max, "r_max", float, low=0, closed="neither"),
            "delta": check_scalar(self.delta, "delta", float, low=0, closed="neither"),
            "seed": check_scalar(self.seed, "seed", int),
            "criterion": check_option(self.criterion, "criterion", CRITERIA),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class NeuronRadii:
    """Outcome of one per-neuron radius search for a layer of ``H`` neurons.

    Attributes
    ----------
    radii : (H,) float64
        Per neuron, the largest radius that was tested and at which all ``p`` sampled
        directions kept ``dev <= eps`` (``r_max`` when saturated, 0 when only the
        center passes; the center always passes since its deviation is 0).
    max_deviation_at_radius : (H,) float64
        The largest deviation over the ``p`` directions at the returned radius, as the
        search computed it (0 for a zero radius). Always ``<= eps``.
    saturated : (H,) bool
        ``radii == r_max`` (the first test, at ``r_max``, passed).
    steps : int
        Radii tested per non-saturated neuron (the test at ``r_max`` included); 1 when
        every neuron saturated.
    evaluations : int
        Neuron-direction deviations evaluated in total, witnesses included (at most
        ``steps * H * (p + 1)``; far fewer in practice because a failing neuron stops at
        its first failing block of directions).
    criterion : str
        ``"rms"`` or ``"paper"``.
    dtype : str
        Arithmetic of the search (``"float32"`` or ``"float64"``).
    """

    radii: np.ndarray
    max_deviation_at_radius: np.ndarray
    saturated: np.ndarray
    steps: int
    evaluations: int
    criterion: str
    dtype: str


def _deviation_denominator(num_samples: int, criterion: str) -> float:
    """``sqrt(N)`` for ``"rms"``, ``N`` for ``"paper"`` (a checked criterion)."""
    return math.sqrt(num_samples) if criterion == "rms" else float(num_samples)


def _check_chunk(chunk: int | None) -> int | None:
    return None if chunk is None else check_scalar(chunk, "chunk", int, low=1)


def _as_array(name: str, value, ndim: int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _check_layer(weight, bias, inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = _as_array("W", weight, 2)
    b = _as_array("b", bias, 1)
    z = _as_array("Z", inputs, 2)
    if w.shape[0] == 0:
        raise ValueError("W has no neurons (shape (0, d_in))")
    if b.shape[0] != w.shape[0]:
        raise ValueError(f"b has shape {b.shape}; expected ({w.shape[0]},) for W of shape {w.shape}")
    if z.shape[1] != w.shape[1]:
        raise ValueError(
            f"Z has shape {z.shape}; expected (N, {w.shape[1]}) to match W of shape {w.shape} "
            "(Z holds the layer's inputs, W is (neurons, inputs))"
        )
    if z.shape[0] == 0:
        raise ValueError("Z is empty: the neuron criterion needs validation inputs")
    return w, b, z


def _draw_blocks(num_rows: int, dim: int, seed: int):
    """The search's random stream: float32 Gaussian rows in blocks of ``_DRAW_BLOCK``.

    Yields ``(start, stop, block)``; ``block`` is a reused buffer (filling fresh memory
    costs more in page faults than drawing the numbers), valid until the next one.
    """
    gen = torch.Generator().manual_seed(int(seed))
    buf = torch.empty(min(_DRAW_BLOCK, num_rows) * dim, dtype=torch.float32)
    for start in range(0, num_rows, _DRAW_BLOCK):
        stop = min(start + _DRAW_BLOCK, num_rows)
        yield start, stop, buf[: (stop - start) * dim].view(stop - start, dim).normal_(generator=gen)


def neuron_directions(
    num_neurons: int, num_directions: int, dim: int, seed: int, *, normalize: bool = True
) -> torch.Tensor:
    """The ``(H, p, dim)`` directions that :func:`neuron_radii` draws for ``seed``.

    ``normalize=True`` gives float64 unit vectors; ``normalize=False`` gives the raw
    float32 Gaussian draws the search multiplies (it normalises through the radius).
    Both describe the same directions.
    """
    for name, value in (("num_neurons", num_neurons), ("num_directions", num_directions),
                        ("dim", dim)):
        check_scalar(value, name, int, low=1)
    rows = num_neurons * num_directions
    out = torch.empty(rows, dim, dtype=torch.float64 if normalize else torch.float32)
    for start, stop, g in _draw_blocks(rows, dim, seed):
        out[start:stop] = g
    if normalize:
        out /= torch.linalg.vector_norm(out, dim=1, keepdim=True)
    return out.reshape(num_neurons, num_directions, dim)


class _Layer:
    """Everything one layer's deviation kernel needs, in the kernel's dtype.

    ``slopes``: ``(H, p, N)`` with ``slopes[h, k] = Za g_hk`` for the (unnormalised)
    direction ``g_hk``; ``inv_norm``: ``(H, p)`` float64 ``1 / ||g_hk||``;
    ``shift = min(a, 0)`` and ``floor = -relu(a)``, ``(H, N)``.
    """

    def __init__(self, w: np.ndarray, b: np.ndarray, z: np.ndarray, dtype: torch.dtype):
        self.dtype = dtype
        self.num_samples = z.shape[0]
        a = torch.as_tensor(z @ w.T + b).T  # (H, N), float64
        self.shift = a.clamp(max=0.0).to(dtype).contiguous()
        self.floor = (-a.clamp(min=0.0)).to(dtype).contiguous()
        za = np.concatenate([z, np.ones((z.shape[0], 1))], axis=1)
        self.za = torch.as_tensor(za, dtype=dtype)  # (N, D)

    def set_directions(self, blocks, num_neurons: int, num_directions: int) -> None:
        rows = num_neurons * num_directions
        slopes = torch.empty(rows, self.num_samples, dtype=self.dtype)
        inv_norm = torch.empty(rows, dtype=torch.float64)
        for start, stop, g in blocks:
            g = g.to(self.dtype)
            inv_norm[start:stop] = 1.0 / torch.linalg.vector_norm(g, dim=1).to(torch.float64)
            torch.mm(g, self.za.T, out=slopes[start:stop])  # (rows, D) @ (D, N)
        if not torch.all(torch.isfinite(inv_norm)):
            raise ValueError("a direction has zero norm")
        self.slopes = slopes.view(num_neurons, num_directions, self.num_samples)
        self.inv_norm = inv_norm.view(num_neurons, num_directions)


def _norms(slopes, scale, shift, floor, out) -> torch.Tensor:
    """``||max(scale * slopes + shift, floor)||`` over the last axis.

    ``slopes`` ``(B, c, N)``, ``scale`` ``(B, c, 1)``, ``shift``/``floor`` ``(B, 1, N)``;
    returns ``(B, c)``. ``out`` (same shape as ``slopes``) is the work area.
    """
    torch.addcmul(shift, slopes, scale, out=out)  # r s + min(a, 0)
    torch.maximum(out, floor, out=out)  # = relu(a + r s) - relu(a)
    return torch.linalg.vector_norm(out, dim=2)


class _Evaluator:
    """Deviations of subsets of neurons at per-neuron radii, chunked over directions.

    ``chunk=None`` sizes each block of directions so that the ``(neurons, chunk, N)``
    work buffer holds about ``_CHUNK_BYTES`` for the neurons still being evaluated.
    """

    def __init__(self, layer: _Layer, criterion: str, chunk: int | None):
        self.layer = layer
        self.denom = _deviation_denominator(layer.num_samples, criterion)
        self.chunk = chunk
        self.itemsize = torch.finfo(layer.dtype).bits // 8
        self.buf = torch.empty(0, dtype=layer.dtype)
        self.evaluations = 0

    def _span(self, num_neurons: int) -> int:
        if self.chunk is not None:
            return self.chunk
        return max(1, _CHUNK_BYTES // (num_neurons * self.layer.num_samples * self.itemsize))

    def _work(self, shape) -> torch.Tensor:
        numel = math.prod(shape)
        if self.buf.numel() < numel:
            self.buf = torch.empty(numel, dtype=self.layer.dtype)
        return self.buf[:numel].view(shape)

    def _scale(self, neurons: torch.Tensor, radii: torch.Tensor, cols=None) -> torch.Tensor:
        """``r_h / ||g_hk||`` in the kernel dtype: the radius along the raw direction."""
        if cols is None:
            return (radii.view(-1, 1) * self.layer.inv_norm[neurons]).to(self.layer.dtype)
        return (radii * self.layer.inv_norm[neurons, cols]).to(self.layer.dtype)

    def witness(self, neurons: torch.Tensor, radii: torch.Tensor, directions: torch.Tensor):
        """Deviation ``(B,)`` float64 of neuron ``neurons[i]`` along ``directions[i]``."""
        lay = self.layer
        slopes = lay.slopes[neurons, directions].unsqueeze(1)  # (B, 1, N) copy
        scale = self._scale(neurons, radii, directions).view(-1, 1, 1)
        norms = _norms(slopes, scale, lay.shift[neurons].unsqueeze(1),
                       lay.floor[neurons].unsqueeze(1), self._work(slopes.shape))
        self.evaluations += len(neurons)
        return norms.view(-1).to(torch.float64) / self.denom

    def full(self, neurons: torch.Tensor, radii: torch.Tensor, eps: float | None):
        """Max deviation over all directions and its argmax, per neuron ``(B,)``.

        With ``eps`` set, a neuron stops being evaluated after the first block of
        directions where it exceeds ``eps`` (its max is then over the blocks seen,
        already > eps). A neuron whose max is ``<= eps`` was evaluated on every
        direction.
        """
        lay = self.layer
        num_neurons, num_directions, num_samples = lay.slopes.shape
        count = len(neurons)
        everyone = count == num_neurons and bool(torch.all(neurons == torch.arange(num_neurons)))
        best = torch.zeros(count, dtype=torch.float64)
        arg = torch.zeros(count, dtype=torch.long)
        scale_all = self._scale(neurons, radii).unsqueeze(2)  # (B, p, 1)
        shift_all = lay.shift[neurons].unsqueeze(1)  # (B, 1, N)
        floor_all = lay.floor[neurons].unsqueeze(1)
        live = torch.arange(count)  # positions in `neurons` still evaluated
        rows, scale, shift, floor = neurons, scale_all, shift_all, floor_all
        views = everyone  # all neurons live: slice the slopes instead of copying
        start = 0
        while start < num_directions:
            stop = min(start + self._span(len(live)), num_directions)
            if views:
                slopes = lay.slopes[:, start:stop]
            else:
                slopes = lay.slopes[rows, start:stop]
            norms = _norms(slopes, scale[:, start:stop], shift, floor,
                           self._work((len(live), stop - start, num_samples)))
            self.evaluations += norms.numel()
            # Division by denom is monotone, so the max commutes with it.
            cmax, carg = norms.max(dim=1)
            cmax = cmax.to(torch.float64) / self.denom
            better = cmax > best[live]
            best[live[better]] = cmax[better]
            arg[live[better]] = carg[better] + start
            start = stop
            if eps is not None:
                keep = best[live] <= eps
                if not bool(keep.all()):
                    live = live[keep]
                    if len(live) == 0:
                        break
                    rows, scale = neurons[live], scale_all[live]
                    shift, floor = shift_all[live], floor_all[live]
                    views = False
        return best, arg

    def all_deviations(self, radii: torch.Tensor) -> torch.Tensor:
        """``(H, p)`` float64 deviations of every neuron along every direction."""
        lay = self.layer
        num_neurons, num_directions, num_samples = lay.slopes.shape
        out = torch.empty(num_neurons, num_directions, dtype=torch.float64)
        scale_all = self._scale(torch.arange(num_neurons), radii).unsqueeze(2)
        shift, floor = lay.shift.unsqueeze(1), lay.floor.unsqueeze(1)
        span = self._span(num_neurons)
        for start in range(0, num_directions, span):
            stop = min(start + span, num_directions)
            norms = _norms(lay.slopes[:, start:stop], scale_all[:, start:stop], shift, floor,
                           self._work((num_neurons, stop - start, num_samples)))
            out[:, start:stop] = norms.to(torch.float64) / self.denom
        return out


def neuron_deviations(
    W, b, Z, directions, radii, criterion: str = "rms", *,
    dtype: torch.dtype = torch.float64, chunk: int | None = None,
) -> np.ndarray:
    """Deviation of every neuron along each of its directions at its radius: ``(H, p)``.

    Entry ``[h, k]`` is ``norm(relu(Za (w_h + radii[h] u)) - relu(Za w_h)) / denom`` with
    ``u = directions[h, k] / ||directions[h, k]||`` (directions need not be unit; they
    are normalised like the search does, through the radius), ``w_h = [W_h; b_h]`` and
    ``denom = sqrt(N)`` (``"rms"``) or ``N`` (``"paper"``). Computed with the same
    kernel as :func:`neuron_radii`; ``dtype=torch.float32`` reproduces its arithmetic.

    Parameters
    ----------
    W : (H, d_in) incoming weights; b : (H,) biases; Z : (N, d_in) layer inputs.
    directions : (H, p, d_in + 1) directions over ``[W_h ; b_h]``.
    radii : (H,) nonnegative radius per neuron, or a scalar for all.
    """
    w, bias, z = _check_layer(W, b, Z)
    check_option(criterion, "criterion", CRITERIA)
    dtype = check_option(dtype, "dtype", DTYPES)
    num_neurons, dim = w.shape[0], w.shape[1] + 1
    if isinstance(directions, torch.Tensor):
        dirs = directions.detach().cpu()
    else:
        dirs = torch.as_tensor(np.asarray(directions))
    if dirs.dim() != 3 or dirs.shape[0] != num_neurons or dirs.shape[2] != dim or dirs.shape[1] == 0:
        raise ValueError(
            f"directions has shape {tuple(dirs.shape)}; expected (H, p, d_in + 1) = "
            f"({num_neurons}, p >= 1, {dim})"
        )
    if not torch.all(torch.isfinite(dirs)):
        raise ValueError("directions contain NaN or infinite values")
    r = np.asarray(radii, dtype=np.float64)
    if r.shape not in ((), (num_neurons,)) or not np.all(np.isfinite(r)) or np.any(r < 0):
        raise ValueError(
            f"radii must be finite and >= 0, a scalar or shape ({num_neurons},); got shape {r.shape}"
        )
    r = np.broadcast_to(r, (num_neurons,))
    num_directions = dirs.shape[1]
    flat = dirs.reshape(-1, dim)
    blocks = (
        (s, min(s + _DRAW_BLOCK, len(flat)), flat[s : s + _DRAW_BLOCK])
        for s in range(0, len(flat), _DRAW_BLOCK)
    )
    layer = _Layer(w, bias, z, dtype)
    layer.set_directions(blocks, num_neurons, num_directions)
    ev = _Evaluator(layer, criterion, _check_chunk(chunk))
    return ev.all_deviations(torch.as_tensor(r.copy())).numpy()


def _bisect(ev: _Evaluator, eps: float, r_max: float, delta: float):
    """Per-neuron bisection, all undecided neurons tested together at each step.

    Returns ``(lower, dev_at_lower, saturated, steps)``: the largest radius tested and
    passed per neuron, the max deviation measured there, whether it was ``r_max``.
    """
    num_neurons = ev.layer.slopes.shape[0]
    lower = torch.zeros(num_neurons, dtype=torch.float64)
    upper = torch.full((num_neurons,), r_max, dtype=torch.float64)
    dev_at_lower = torch.zeros(num_neurons, dtype=torch.float64)  # the center: 0
    witness = torch.zeros(num_neurons, dtype=torch.long)
    saturated = torch.zeros(num_neurons, dtype=torch.bool)
    active = torch.arange(num_neurons)
    steps = 0
    while len(active):
        # Same arithmetic as the scalar loop of radius.search_radius.
        radii = upper[active].clone() if steps == 0 else 0.5 * (lower[active] + upper[active])
        steps += 1
        # A neuron fails as soon as one direction fails: try the likeliest one first,
        # the direction that deviated most at the neuron's previous test.
        passes = ev.witness(active, radii, witness[active]) <= eps
        maybe = passes.nonzero().view(-1)
        if len(maybe):
            best, arg = ev.full(active[maybe], radii[maybe], eps)
            ok = best <= eps
            passes[maybe[~ok]] = False
            witness[active[maybe]] = arg
            dev_at_lower[active[maybe[ok]]] = best[ok]
        lower[active[passes]] = radii[passes]
        upper[active[~passes]] = radii[~passes]
        if steps == 1:
            saturated[active[passes]] = True
        active = active[(upper[active] - lower[active]) > delta]
    return lower, dev_at_lower, saturated, steps


def neuron_radii(
    W, b, Z, search: NeuronSearch, *, chunk: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> NeuronRadii:
    """Good-enough radius of every neuron of a ReLU layer (batched bisection).

    For each neuron ``h`` with parameters ``w_h = [W_h ; b_h]``: the largest tested
    radius ``R_h`` such that all ``p`` sampled unit directions ``u`` give
    ``dev(w_h + R_h u) <= eps`` (see the module docstring for ``dev``). Bisection over
    ``[0, r_max]`` down to width ``delta``; ``r_max`` is tested first (a pass returns
    ``r_max``). Every step tests all undecided neurons at once, each at its own midpoint.

    Parameters
    ----------
    W : (H, d_in) incoming weights of the layer's neurons.
    b : (H,) biases.
    Z : (N, d_in) the layer's inputs on the node's validation data (the outputs of
        layer ``j - 1``, or the raw features for the first hidden layer).
    search : ``eps``, ``num_directions``, ``r_max``, ``delta``, ``seed`` and
        ``criterion`` (see :class:`NeuronSearch`).
    chunk : directions per block of the ``(neurons, chunk, N)`` work buffer; the
        default keeps it near 2 MiB. Does not change the radii.
    dtype : arithmetic of the search; float32 (default) or float64.

    Memory: the slopes ``(H p, N)`` in ``dtype`` (200 MB in float32 for H = 100,
    p = 500, N = 1000) plus a block of raw draws and the work buffer.
    """
    w, bias, z = _check_layer(W, b, Z)
    if not isinstance(search, NeuronSearch):
        raise TypeError(f"search must be a NeuronSearch, got {type(search).__name__}")
    dtype = check_option(dtype, "dtype", DTYPES)
    chunk = _check_chunk(chunk)
    num_neurons, dim, p = w.shape[0], w.shape[1] + 1, search.num_directions

    layer = _Layer(w, bias, z, dtype)
    layer.set_directions(_draw_blocks(num_neurons * p, dim, search.seed), num_neurons, p)
    ev = _Evaluator(layer, search.criterion, chunk)
    lower, dev_at_lower, saturated, steps = _bisect(ev, search.eps, search.r_max, search.delta)
    return NeuronRadii(
        radii=lower.numpy(),
        max_deviation_at_radius=dev_at_lower.numpy(),
        saturated=saturated.numpy(),
        steps=steps,
        evaluations=ev.evaluations,
        criterion=search.criterion,
        dtype=str(dtype).removeprefix("torch."),
    )
