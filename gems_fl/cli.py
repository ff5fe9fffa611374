"""The ``gems-fl`` command."""

from __future__ import annotations

import argparse
import sys

from gems_fl.settings import SettingsError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gems-fl", description="GEMS on Flower.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the Flower simulation (flwr run) and check that it succeeded",
        description="Start a private local SuperLink, `flwr run` the app as a simulation "
        "with N SuperNodes, stream its logs, and exit non-zero unless the run completed "
        "and wrote its results. The SuperLink is always stopped afterwards.",
    )
    run.add_argument("app", nargs="?", default=".", help="Flower app folder (default: .)")
    run.add_argument("--nodes", type=int, default=5, help="number of SuperNodes (default: 5)")
    run.add_argument("--run-config", "-c", default=None,
                     help="overrides, e.g. \"eps=0.5 dataset='fashion-mnist'\"")
    run.add_argument("--output-dir", default=None, help="results folder (setting output-dir)")
    show = sub.add_parser("show", help="print the tables of a results.json")
    show.add_argument("path", help="a results.json written by a run")
    show.add_argument("--markdown", action="store_true", help="markdown instead of rich tables")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gems-fl`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "show":
        return _show(args.path, args.markdown)
    from gems_fl.launch import RunFailed, run_app

    try:
        outcome = run_app(args.app, num_nodes=args.nodes, run_config=args.run_config,
                          output_dir=args.output_dir)
    except (SettingsError, ValueError, FileNotFoundError) as exc:
        print(f"gems-fl: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"gems-fl: run failed: {exc}", file=sys.stderr)
        return 1
    print(f"gems-fl: run {outcome.run_id} completed; results in {outcome.results_path}")
    return 0


def _show(path: str, markdown: bool) -> int:
    import json
    from pathlib import Path

    from gems_fl.results import markdown_table, print_results

    try:
        results = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"gems-fl: error: cannot read results from {path}: {exc}", file=sys.stderr)
        return 2
    if markdown:
        print(markdown_table(results))
    else:
        print_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
