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
    rep = sub.add_parser(
        "reproduce",
        help="reproduce the paper's evaluation (tables, plots, JSON) on Fashion-MNIST",
        description="Run the paper's studies through the real GEMS apps in-process and "
        "write each study's markdown table (mean (std) over seeds), JSON and PNG plots to "
        "the output folder. Studies: 1 convex table, 2 NN table, 3 fine-tuning, 4 model "
        "size, 5 intersection analysis, 6 FedAvg/FedProx vs GEMS. Finished trials are kept "
        "in OUT/trials and not rerun; --fresh starts over.",
    )
    rep.add_argument("--quick", action="store_true",
                     help="small preset on the embedded digits data (2 seeds, coarse grids)")
    rep.add_argument("--out", default="reproduction", help="output folder (default: reproduction)")
    rep.add_argument("--studies", default="1,2,3,4,5,6", help="comma-separated, e.g. 1,6")
    rep.add_argument("--seeds", type=int, default=None,
                     help="number of seeds 0..N-1 (default: 5, quick: 2)")
    rep.add_argument("--dataset", default=None, help="default: fashion-mnist (quick: digits)")
    rep.add_argument("--data-dir", default="", help="dataset folder (setting data-dir)")
    rep.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    rep.add_argument("--fresh", action="store_true", help="discard stored trials and cache")
    show = sub.add_parser("show", help="print the tables of a results.json")
    show.add_argument("path", help="a results.json written by a run")
    show.add_argument("--markdown", action="store_true", help="markdown instead of rich tables")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gems-fl`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "show":
        return _show(args.path, args.markdown)
    if args.command == "reproduce":
        return _reproduce(args, argv)
    from gems_fl.running.launch import RunFailed, run_app

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


def _reproduce(args: argparse.Namespace, argv: list[str] | None) -> int:
    from gems_fl.reproduce import Options, expected_files, reproduce

    try:
        studies = tuple(sorted({int(s) for s in args.studies.split(",") if s.strip()}))
    except ValueError:
        print(f"gems-fl: error: --studies {args.studies!r} must be numbers like 1,2,6",
              file=sys.stderr)
        return 2
    changes = {"studies": studies, "data_dir": args.data_dir}
    if args.seeds is not None:
        if args.seeds < 1:
            print("gems-fl: error: --seeds must be >= 1", file=sys.stderr)
            return 2
        changes["seeds"] = tuple(range(args.seeds))
    if args.dataset:
        changes["dataset"] = args.dataset
    try:
        options = Options.quick_preset(**changes) if args.quick else Options(**changes)
        command = "gems-fl " + " ".join(sys.argv[1:] if argv is None else argv)
        summary = reproduce(options, args.out, jobs=args.jobs, fresh=args.fresh, command=command)
    except (SettingsError, ValueError, FileNotFoundError) as exc:
        print(f"gems-fl: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"gems-fl: reproduction failed: {exc}", file=sys.stderr)
        return 1
    missing = [f for f in expected_files(options) if not (summary.parent / f).exists()]
    if missing:
        print(f"gems-fl: reproduction incomplete, missing {missing}", file=sys.stderr)
        return 1
    print(f"gems-fl: reproduction written to {summary.parent} (summary: {summary})")
    return 0


def _show(path: str, markdown: bool) -> int:
    import json
    from pathlib import Path

    from gems_fl.evaluation.results import markdown_table, print_results

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
