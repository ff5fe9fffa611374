"""Extract and cache a dataset's features ahead of a run.

    python3 -m gems_fl.data.prepare cifar10 --data-dir DIR --vgg16-weights FILE
    python3 -m gems_fl.data.prepare ham10000 --data-dir DIR --seed 0

A run finds the cache entry written here (same data, weights, cache folder and, for
HAM10000, the same seed and settings) and starts without recomputing features. Without
this step the first run's nodes extract the features themselves, one node computing
while the others wait on the cache lock.
"""

from __future__ import annotations

import argparse
import logging

from gems_fl.data.datasets import FeatureOptions, load_dataset
from gems_fl.data.feature_cache import resolve_cache_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Extract and cache CIFAR-10 / HAM10000 features.")
    parser.add_argument("dataset", choices=("cifar10", "ham10000"))
    parser.add_argument("--data-dir", required=True, help="the run setting data-dir")
    parser.add_argument("--seed", type=int, default=0, help="the run setting seed (HAM10000 features depend on it)")
    defaults = FeatureOptions()
    parser.add_argument("--vgg16-weights", default=defaults.vgg16_weights)
    parser.add_argument("--feature-cache-dir", default=defaults.feature_cache_dir)
    parser.add_argument("--ham10000-per-class", type=int, default=defaults.ham10000_per_class)
    parser.add_argument("--ham10000-cnn-epochs", type=int, default=defaults.ham10000_cnn_epochs)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    options = FeatureOptions(args.vgg16_weights, args.feature_cache_dir,
                             args.ham10000_per_class, args.ham10000_cnn_epochs)
    splits = load_dataset(args.dataset, seed=args.seed, data_dir=args.data_dir, features=options)
    print(f"{args.dataset}: {splits.num_features} features, splits {splits.split_sizes()}; "
          f"cache folder {resolve_cache_dir(args.feature_cache_dir)}")


if __name__ == "__main__":
    main()
