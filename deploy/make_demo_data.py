"""Write demo node data files: one .npz per site, cut from a dataset's label partitions.

    python3 deploy/make_demo_data.py OUT_DIR [--nodes 3] [--dataset digits] [--seed 0]

Writes OUT_DIR/site-0.npz ... (arrays x_train, y_train, x_val, y_val): exactly the data
partition k gets in a simulation with the same dataset, label-division and seed. Copy
site-k.npz to machine k and start its SuperNode with
--node-config "data-path='/srv/gems/site-k.npz' node-name='site-k'".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gems_fl.data.nodes import write_partition_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--label-division", default="paper")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    for path in write_partition_files(args.out_dir, args.nodes, dataset=args.dataset,
                                      label_division=args.label_division, seed=args.seed,
                                      data_dir=args.data_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
