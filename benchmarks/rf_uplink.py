"""Random features: the pooled LDA point from each uplink form of the Gram statistics.

    python3 benchmarks/rf_uplink.py --divisions dirichlet:0.1:5 --dims 2048 --rounds 200

For each division (Fashion-MNIST, ``SPEC:K``), seed and width D, the nodes' training
rows are divided as a run divides them (``node_data``), mapped by the run's
random-feature map (``rf-map``, bandwidth from the pooled feature sums as
``rf-bandwidth=auto`` computes it, the run's seed: ``fedavg.feature_map``), and the server's pooled LDA point
(the point the federated runs' selection keeps, ``results/benchmarks/random_features.json``)
is built from what each form of the statistics would deliver:

- ``whole``: every node's Gram matrix, a float32 triangle (``gram-rank=0``);
- ``rank r`` (``--ranks``; ``auto`` is the run's default): the float16 rank-r factor
  plus the residual diagonal each node sends (``kinds.node_gram``, the node's own code);
- ``cg t``: ``t`` rounds of Gram products (:func:`gems_lab.products.lda_by_products`):
  a round of label moments and the Gram diagonal, then one ``(D, C)`` float32 block
  down and one up per round; the accuracy after every round is kept
  (``--rounds``; the table shows the first round within 0.1 and 0.5 point of ``whole``).

Test accuracy on the official 10,000 test images. Bytes are the statistics' own numbers
(float32 = 4 bytes, float16 = 2), per node, up (node to server) and both ways; the
selection and evaluate rounds of a real run come on top for every form alike. This is
the server's arithmetic on the nodes' real rows, not a Flower run: its products are what
each node would return, cast to float32 as the wire would carry them.
Writes JSON (``--out``, default ``results/benchmarks/rf_uplink.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--divisions", "paper:3", "--dims", "128", "--rounds", "5"]]

from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.data.random_features import RandomFeatures
from gems_fl.geometry import choices
from gems_fl.geometry.kinds import node_gram
from gems_fl.geometry.pooled import pooled_lda
from gems_fl.settings import Settings
from gems_lab.fedavg import feature_map
from gems_lab.products import lda_by_products

FLOAT32, FLOAT16 = 4, 2


def _augmented(features: RandomFeatures, x: np.ndarray) -> torch.Tensor:
    return _augmented_rows(features.transform(x))


def _accuracy(point: np.ndarray, z_test: torch.Tensor, y_test: np.ndarray) -> float:
    scores = z_test @ torch.as_tensor(point, dtype=torch.float64).T
    return float((scores.argmax(1).numpy() == y_test).mean())


def one_division(spec: str, nodes: int, seed: int, dim: int, kind: str, ranks: list[str],
                 rounds: int, dataset: str = "fashion-mnist") -> dict:
    t0 = time.perf_counter()
    splits = load_dataset(dataset, seed=seed)
    division = parse_division(spec, nodes, splits.num_classes)
    parts = [node_data(splits, division, k, seed) for k in range(nodes)]
    parts = [p for p in parts if len(p[1])]
    run = Settings(dataset=dataset, label_division=spec, seed=seed,
                   model="random-features", rf_map=kind, rf_dim=dim)
    features = feature_map(run, nodes, splits)  # the map a run with these settings agrees on
    bandwidth = features.bandwidth
    classes = splits.num_classes
    mapped = [features.transform(p[0]) for p in parts]  # float32, as the node maps them
    counts = [len(p[1]) for p in parts]
    weights = np.asarray(counts, dtype=np.float64) / sum(counts)
    moments, grams = [], []
    for z, (_, y, _, _) in zip(mapped, parts):
        za = _augmented_rows(z)
        moments.append((torch.nn.functional.one_hot(torch.as_tensor(y), classes).double().T @ za
                        / len(y)).numpy())
        grams.append((za.T @ za / len(y)).numpy())
    z_test = _augmented(features, splits.test_x)
    setup_s = time.perf_counter() - t0
    n = dim + 1
    moment_bytes = classes * n * FLOAT32 + FLOAT32  # the label moments and the row count
    rows = {}

    t = time.perf_counter()
    whole = pooled_lda(grams, moments, counts)
    rows["whole"] = {"accuracy": _accuracy(whole, z_test, splits.test_y),
                     "bytes_up": n * (n + 1) // 2 * FLOAT32 + moment_bytes,
                     "rounds": 1, "server_s": time.perf_counter() - t}
    for rank in ranks:
        r = choices.gram_rank_for(rank, n)
        if r <= 0:
            continue
        t = time.perf_counter()
        sent = [node_gram(z, r)[0] for z in mapped]
        point = pooled_lda(sent, moments, counts)
        rows[f"rank {rank} ({r})"] = {
            "accuracy": _accuracy(point, z_test, splits.test_y),
            "bytes_up": n * r * FLOAT16 + n * FLOAT32 + moment_bytes, "rounds": 1,
            "nodes_and_server_s": time.perf_counter() - t}

    pooled_moments = sum(w * m for w, m in zip(weights, moments))
    pooled_diagonal = sum(w * np.diag(g) for w, g in zip(weights, grams))
    node_rows = [_augmented_rows(z) for z in mapped]

    def product(v: np.ndarray) -> np.ndarray:
        down = torch.as_tensor(v.astype(np.float32), dtype=torch.float64)  # as sent
        padded = torch.cat([down, torch.zeros(1, down.shape[1], dtype=down.dtype)])
        total = torch.zeros_like(down)
        for w, za in zip(weights, node_rows):
            up = (za.T @ (za @ padded))[:-1] / len(za)  # the node's reply, float32 on the wire
            total += float(w) * up.float().double()
        return total.numpy()

    t = time.perf_counter()
    points = lda_by_products(product, pooled_moments, pooled_diagonal, rounds)
    curve = [_accuracy(p, z_test, splits.test_y) for p in points]
    round_bytes = dim * classes * FLOAT32
    rows["cg"] = {"accuracy_by_round": curve, "bytes_up_first": moment_bytes + n * FLOAT32,
                  "bytes_per_round_each_way": round_bytes, "server_and_nodes_s": time.perf_counter() - t}
    return {"division": spec, "nodes": nodes, "seed": seed, "dim": dim, "map": kind,
            "bandwidth": bandwidth, "setup_s": setup_s, "forms": rows}


def _augmented_rows(z: np.ndarray) -> torch.Tensor:
    zt = torch.as_tensor(z, dtype=torch.float64)
    return torch.cat([zt, torch.ones(len(zt), 1, dtype=zt.dtype)], 1)


def cg_rounds_within(result: dict, gap: float) -> int | None:
    """The first CG round whose accuracy is within ``gap`` of the whole matrix's."""
    target = result["forms"]["whole"]["accuracy"] - gap
    curve = result["forms"]["cg"]["accuracy_by_round"]
    return next((t + 1 for t, a in enumerate(curve) if a >= target), None)


def cg_bytes(result: dict, rounds: int) -> tuple[int, int]:
    cg = result["forms"]["cg"]
    up = cg["bytes_up_first"] + rounds * cg["bytes_per_round_each_way"]
    return up, up + rounds * cg["bytes_per_round_each_way"]


def print_table(result: dict) -> None:
    print(f"\n{result['division']} K={result['nodes']} seed {result['seed']} D={result['dim']} "
          f"({result['map']}, bandwidth {result['bandwidth']:.3f})")
    print("| form | rounds | test accuracy | MB up per node | MB both ways per node |")
    print("| --- | ---: | ---: | ---: | ---: |")
    forms = result["forms"]
    for name, row in forms.items():
        if name == "cg":
            continue
        mb = row["bytes_up"] / 1e6
        print(f"| {name} | 1 | {row['accuracy']:.4f} | {mb:.2f} | {mb:.2f} |")
    curve = forms["cg"]["accuracy_by_round"]
    shown = sorted({t for t in (cg_rounds_within(result, 0.005), cg_rounds_within(result, 0.001),
                                len(curve)) if t})
    for t in shown:
        up, both = cg_bytes(result, t)
        print(f"| cg products | 1 + {t} | {curve[t - 1]:.4f} | {up / 1e6:.2f} | {both / 1e6:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--divisions", nargs="+", default=["dirichlet:0.1:5"],
                        help="SPEC:K, e.g. dirichlet:0.1:5 or paper:5")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--dims", nargs="+", type=int, default=[2048])
    parser.add_argument("--map", default="fourier", choices=("fourier", "relu"))
    parser.add_argument("--ranks", nargs="+", default=["auto"],
                        help="factor forms to compare (auto: the run's default rank)")
    parser.add_argument("--rounds", type=int, default=200, help="CG product rounds")
    parser.add_argument("--out", type=Path, default=Path(default_out("rf_uplink")))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    results = []
    for text in args.divisions:
        spec, _, k = text.rpartition(":")
        if not spec or not k.isdigit():
            raise SystemExit(f"--divisions {text!r}: give SPEC:K, e.g. dirichlet:0.1:5")
        for seed in args.seeds:
            for dim in args.dims:
                print(f"{spec} K={k} seed {seed} D={dim} ...", flush=True)
                results.append(one_division(spec, int(k), seed, dim, args.map, args.ranks,
                                            args.rounds, args.dataset))
                print_table(results[-1])
                write_envelope("rf_uplink", args.out, {"args": {
                    k2: (str(v) if isinstance(v, Path) else v) for k2, v in vars(args).items()},
                    "runs": results}, seeds=args.seeds)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
