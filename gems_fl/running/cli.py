"""The ``gems-fl`` command."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import fields

from gems_fl.settings import Settings, SettingsError


def version_text() -> str:
    """``gems-fl X (flwr Y, Python Z)``."""
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"gems-fl {version('gems-fl')} (flwr {version('flwr')}, Python {platform.python_version()})"


def settings_epilog(width: int = 100) -> str:
    """Every run setting with its default and meaning (from the declarations in
    :mod:`gems_fl.settings`, like the README table)."""
    import json

    from gems_fl.settings_doc import meaning

    lines = ["run settings (--run-config \"key=value ...\"; quote text values: "
             "\"dataset='fashion-mnist'\"):"]
    for field in fields(Settings):
        key = field.name.replace("_", "-")
        default = json.dumps(field.default) if isinstance(field.default, (str, bool)) else field.default
        text = meaning(key).replace("`", "")
        lines.append(f"  {key} = {default}")
        lines.extend(textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gems-fl", description="GEMS on Flower.")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the Flower simulation (flwr run) and check that it succeeded",
        description="Check the settings, data and output folder, start a private local "
        "SuperLink, `flwr run` the app as a simulation with N SuperNodes, show its log and "
        "phases, and exit non-zero unless the run completed and wrote its results. "
        "Everything it starts is stopped at the end and on Ctrl-C, SIGTERM or SIGHUP "
        "(exit 130, 143, 129). Exit 2: a setting or a preflight check failed, nothing started.",
        epilog=settings_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("app", nargs="?", default=".", help="Flower app folder (default: .)")
    run.add_argument("--nodes", type=int, default=5, help="number of SuperNodes (default: 5)")
    run.add_argument("--cpus-per-node", type=int, default=1,
                     help="CPUs the simulation reserves per node (Flower's "
                     "client-resources-num-cpus; default 1: every core runs a node)")
    run.add_argument("--run-config", "-c", default=None,
                     help="overrides, e.g. \"eps=0.5 dataset='fashion-mnist'\"")
    run.add_argument("--output-dir", default=None, help="results folder (setting output-dir)")
    rep = sub.add_parser(
        "reproduce",
        help="reproduce the paper's evaluation (tables, plots, JSON) on Fashion-MNIST",
        description="Run the paper's studies through the real GEMS apps in-process and "
        "write each study's markdown table (mean (std) over seeds), JSON and PNG plots to "
        "the output folder. Studies: 1 convex table, 2 NN table, 3 fine-tuning, 4 model "
        "size, 5 intersection analysis, 6 FedAvg/FedProx vs GEMS, 7 Dirichlet divisions "
        "(the Gram points and refinement rounds). Finished trials are kept "
        "in OUT/trials and not rerun; --fresh starts over.",
    )
    rep.add_argument("--quick", action="store_true",
                     help="small preset on the embedded digits data (2 seeds, coarse grids)")
    rep.add_argument("--out", default="reproduction", help="output folder (default: reproduction)")
    rep.add_argument("--studies", default="1,2,3,4,5,6,7", help="comma-separated, e.g. 1,6,7")
    rep.add_argument("--seeds", type=int, default=None,
                     help="number of seeds 0..N-1 (default: 5, quick: 2)")
    rep.add_argument("--dataset", default=None, help="default: fashion-mnist (quick: digits)")
    rep.add_argument("--data-dir", default="", help="dataset folder (setting data-dir)")
    rep.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    rep.add_argument("--fresh", action="store_true", help="discard stored trials and cache")
    sub_ = sub.add_parser(
        "submit",
        help="run the app on a deployed SuperLink; exit non-zero unless it completed",
        description="`flwr run APP SUPERLINK --stream` on the named connection entry of "
        "Flower's config ($FLWR_HOME/config.toml, [superlink.NAME]), then read the run's final "
        "status with `flwr ls`. Exit 0 only when the run ended finished:completed; exit 1 when "
        "it failed, was stopped, or the SuperLink stopped answering (the cause is printed); "
        "exit 2 for an invalid setting (nothing submitted).",
        epilog=settings_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub_.add_argument("app", nargs="?", default=".", help="Flower app folder (default: .)")
    sub_.add_argument("--superlink", "--federation", dest="superlink", required=True,
                      help="name of the connection entry, e.g. gems-tls")
    sub_.add_argument("--run-config", "-c", default=None,
                      help="overrides, e.g. \"dataset='node-files' evaluate-on-server=false\"")
    check = sub.add_parser(
        "check-data",
        help="check a site's data file the way its node will read it",
        description="Read FILE (.npz, or .csv with <stem>_val.csv and optional <stem>_test.csv) "
        "as a SuperNode's data-path, print shapes, class counts, NaN/inf and missing arrays, "
        "and what a run would reject. Exit 0: a node with this file takes part; 1: it would "
        "be left out.")
    check.add_argument("file", help="the site's data file")
    check.add_argument("--features", type=int, default=None,
                       help="the run's number of features (setting num-features)")
    check.add_argument("--classes", default="",
                       help="the run's classes: comma-separated names or a count (setting classes)")
    check.add_argument("--label-column", default="",
                       help="CSV label column: number or header name (default: last)")
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
    if args.command == "check-data":
        from gems_fl.running.check_data import check_data

        return check_data(args.file, features=args.features, classes=args.classes,
                          label_column=args.label_column)
    if args.command == "submit":
        return _submit(args)
    return _run(args)


def _submit(args: argparse.Namespace) -> int:
    from gems_fl.running.outcome import RunFailed
    from gems_fl.running.submit import submit

    try:
        run = submit(args.app, args.superlink, args.run_config)
    except (SettingsError, ValueError, FileNotFoundError) as exc:
        print(f"gems-fl: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        sys.stdout.flush()
        print("\n".join([f"gems-fl: run failed: {exc}" + (":" if exc.errors else ""),
                         *exc.errors]), file=sys.stderr)
        return 1
    print(f"gems-fl: run {run.run_id} on '{args.superlink}' completed (finished:completed); "
          "the results are on the SuperLink's machine, see the log's 'Results written to' line")
    return 0


def _run(args: argparse.Namespace) -> int:
    from gems_fl.running.launch import run_app
    from gems_fl.running.outcome import RunFailed, RunInterrupted
    from gems_fl.running.timing import timing_line

    try:
        outcome = run_app(args.app, num_nodes=args.nodes, run_config=args.run_config,
                          cpus_per_node=args.cpus_per_node,
                          output_dir=args.output_dir, progress=True)
    except (SettingsError, ValueError, FileNotFoundError) as exc:
        print(f"gems-fl: error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(f"gems-fl: {exc}", file=sys.stderr)
        return exc.exit_code
    except RunFailed as exc:
        sys.stdout.flush()
        lines = [f"gems-fl: run failed: {exc}" + (":" if exc.errors else "")]
        lines += exc.errors
        if exc.log_path is not None:
            lines.append(f"gems-fl: full log: {exc.log_path}")
        print("\n".join(lines), file=sys.stderr)
        return 1
    print(f"gems-fl: run {outcome.run_id} completed; results in {outcome.results_path}"
          + (f" (log: {outcome.log_path})" if outcome.log_path else ""))
    print(f"gems-fl: time: {timing_line(outcome.results.get('timing_s', {}))}")
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
