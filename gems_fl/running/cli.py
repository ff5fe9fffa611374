"""The ``gems-fl`` command."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import fields

from gems_fl.extensions import commands
from gems_fl.settings import Settings, SettingsError

DEFAULT_DIVISION = "dirichlet:0.5"  # gems-fl split and run --table: label skew, every class


def version_text() -> str:
    """``gems-fl X (flwr Y, Python Z)``."""
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    libraries = ", ".join(f"{name} {version(dist)}" for name, dist in (
        ("flwr", "flwr"), ("torch", "torch"), ("numpy", "numpy"), ("scikit-learn", "scikit-learn")))
    return f"gems-fl {version('gems-fl')} ({libraries}, Python {platform.python_version()})"


def settings_epilog(width: int = 100) -> str:
    """Every run setting with its default and meaning (from the declarations in
    :mod:`gems_fl.settings`, like the README table)."""
    import json

    from gems_fl.settings.doc import meaning

    heads = {"user": ["run settings (--run-config \"key=value ...\"; quote text values: "
                      "\"dataset='fashion-mnist'\"):"],
             "more": ["", "more settings: the internals (docs/settings.md):"],
             "lab": ["", "research switches of the paper's studies, inside one setting "
                     "(docs/settings.md):", '  lab = ""',
                     "      key=value pairs of the switches below, e.g. --run-config "
                     "\"lab='tune-curve=100,200 profile=paper'\""]}
    lines: list[str] = []
    for group, head in heads.items():
        lines.extend(head)
        for field in fields(Settings):
            kind = ("lab" if field.metadata["lab"] else "user" if field.metadata["user"]
                    else "more")
            if kind != group:
                continue
            key = field.name.replace("_", "-")
            default = (json.dumps(field.default) if isinstance(field.default, (str, bool))
                       else field.default)
            lines.append(f"  {key} = {default}")
            lines.extend(textwrap.wrap(meaning(key).replace("`", ""), width,
                                       initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gems-fl", description="GEMS on Flower.")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_submit(sub)
    _add_pull_and_status(sub)
    _add_check_data(sub)
    _add_split(sub)
    _add_predict(sub)
    show = sub.add_parser("show", help="print the tables of a run (its folder or results.json)")
    show.add_argument("path", help="a run's folder (<output-dir>/run-<id>) or its results.json")
    show.add_argument("--markdown", action="store_true", help="markdown instead of rich tables")
    show.add_argument("--plot", action="store_true",
                      help="also write result.png beside it (per site: h_G, Local, Averaged)")
    for command in commands():
        command.add_parser(sub)
    return parser


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="run the Flower simulation (flwr run) and check that it succeeded",
        description="Check the settings, data and output folder, start a private local "
        "SuperLink, `flwr run` the app as a simulation with N SuperNodes, show its log and "
        "phases, and exit non-zero unless the run completed and wrote its results. "
        "Everything it starts is stopped at the end and on Ctrl-C, SIGTERM or SIGHUP "
        "(exit 130, 143, 129). Exit 0: completed with the sites required-nodes requires; "
        "1: the run failed; 2: a setting or a preflight check failed, nothing started; 3: the "
        "run completed and wrote its results, but a required site was left out or died; 4: "
        "the run completed and wrote its results, but h_G was good enough on fewer sites "
        "than min-good-enough asks.",
        epilog=settings_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("app", nargs="?", default=None,
                     help="Flower app folder (default: this folder when it holds one, else "
                     "the app the gems-fl package carries)")
    run.add_argument("--nodes", type=int, default=None,
                     help="number of SuperNodes (default: 5, or one per --site)")
    run.add_argument("--site", action="append", default=None, metavar="FILE",
                     help="try your own data before deploying: one simulated node per site "
                     "file (.npz, or .csv; an optional <stem>_val.csv holds its validation rows, else "
                     "the node sets aside val-fraction of its rows), named by its stem, with the "
                     "identity round's agreement, scaling and node-side evaluation of a "
                     "deployed run; repeat for each site (sets dataset='node-files' and, "
                     "without public-data, evaluate-on-server=false)")
    run.add_argument("--table", default=None, metavar="FILE",
                     help="rehearse on one CSV table: cut it into --nodes site files by "
                     "--division (as gems-fl split does, under the output folder, with a held-out "
                     "test.csv), then run on them as with --site")
    run.add_argument("--division", default=DEFAULT_DIVISION,
                     help=f"with --table: the label division (default {DEFAULT_DIVISION}; also "
                     "iid, classes-per-node:N, groups such as 0,1/2,3)")
    run.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                     help="run the simulated nodes on an existing Ray cluster (its head's "
                     "address, as `ray start --head` prints it) instead of a private Ray "
                     "instance on this machine")
    run.add_argument("--cpus-per-node", type=int, default=1,
                     help="CPUs the simulation reserves per node (Flower's "
                     "client-resources-num-cpus; default 1: every core runs a node)")
    run.add_argument("--run-config", "-c", default=None,
                     help="overrides, e.g. \"eps=0.5 dataset='fashion-mnist'\"")
    run.add_argument("--output-dir", default=None, help="results folder (setting output-dir)")
    run.add_argument("--verbose", "-v", action="store_true",
                     help="also show Flower's and the ServerApp's INFO lines (the round-by-round "
                     "log); they are always in run.log beside the results")
    run.add_argument("--plot", action="store_true",
                     help="also write result.png beside results.json: per site, h_G, its own "
                     "Local model and Averaged on its own data, with its eps")


def _add_submit(sub: argparse._SubParsersAction) -> None:
    sub_ = sub.add_parser(
        "submit",
        help="run the app on a deployed SuperLink, watch it, bring its results home",
        description="`flwr run APP SUPERLINK --stream` on the named connection entry of "
        "Flower's config ($FLWR_HOME/config.toml, [superlink.NAME]), shown like `gems-fl run` "
        "(phases, kept log, error summary), then the run's final status from `flwr ls`. The "
        "results the ServerApp sends home in the run's log are written to "
        "OUTPUT_DIR/run-<id>/ (results.json, gems_model.npz, run.log). Ctrl-C, SIGTERM or "
        "SIGHUP stop the run on the SuperLink (flwr stop) and exit 130, 143 or 129. Exit 0: "
        "completed with every required site; 1: the run failed, was stopped, the SuperLink "
        "stopped answering or the results did not come home (the cause is printed); 2: an "
        "invalid setting (nothing submitted); 3: completed and results home, but a site that "
        "required-nodes requires was left out or died; 4: completed and results home, but h_G "
        "was good enough on fewer sites than min-good-enough asks.",
        epilog=settings_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub_.add_argument("app", nargs="?", default=None,
                      help="Flower app folder (default: this folder when it holds one, else "
                      "the app the gems-fl package carries)")
    sub_.add_argument("--superlink", "--federation", dest="superlink", required=True,
                      help="name of the connection entry, e.g. gems-tls")
    sub_.add_argument("--run-config", "-c", default=None,
                      help="overrides, e.g. \"dataset='node-files' evaluate-on-server=false\"")
    sub_.add_argument("--output-dir", default="gems-results",
                      help="where the results come home on this machine (default: gems-results)")
    sub_.add_argument("--verbose", "-v", action="store_true",
                      help="also show Flower's and the ServerApp's INFO lines (always in the "
                      "kept log)")
    sub_.add_argument("--detach", action="store_true",
                      help="start the run and return; prints how to follow, stop and fetch it")


def _add_pull_and_status(sub: argparse._SubParsersAction) -> None:
    pull = sub.add_parser(
        "pull", help="bring a finished deployed run's results home (from its log)",
        description="Read the log of finished run RUN_ID from the SuperLink (`flwr log --show`) "
        "and write the results the ServerApp sent home in it to OUTPUT_DIR/run-<id>/. Exit 0: "
        "written; 1: the run has not finished, or its log carries no intact results.")
    pull.add_argument("run_id", type=int, help="the run's id (flwr ls)")
    pull.add_argument("--superlink", required=True, help="name of the connection entry")
    pull.add_argument("--output-dir", default="gems-results", help="default: gems-results")
    pull.add_argument("--app", default=".", help="the app checkout the run was submitted from "
                      "(its git commit goes into results.json; default: .)")
    stat = sub.add_parser(
        "status", help="the SuperNodes connected to a SuperLink (by name) and its runs",
        description="`flwr supernode ls` and `flwr ls` on the connection entry, with each "
        "SuperNode's node-name (as it reported it in the latest runs' identity round) and the "
        "phase of each unfinished run (from its log).")
    stat.add_argument("--superlink", required=True, help="name of the connection entry")


def _add_check_data(sub: argparse._SubParsersAction) -> None:
    """``gems-fl check-data``."""
    check = sub.add_parser(
        "check-data",
        help="check a site's data file the way its node will read it",
        description="Read FILE (.npz, or .csv with optional <stem>_val.csv and <stem>_test.csv) "
        "as a SuperNode's data-path, print shapes, class counts, NaN/inf and missing arrays, "
        "and what a run would reject; with several files, also whether they agree (number of "
        "features; column names, in any order, where they have a header row). Exit 0: a node "
        "with each file takes part; 1: one would be left out.")
    check.add_argument("file", nargs="+", help="the site's data file; several sites' files are "
                       "also checked against each other (features, column names)")
    check.add_argument("--features", type=int, default=None,
                       help="the run's number of features (setting num-features)")
    check.add_argument("--classes", default="",
                       help="the run's classes: comma-separated names or a count (setting classes)")
    check.add_argument("--label-column", default="",
                       help="CSV label column: number counted from 0, or header name (default: "
                       "last; setting label-column)")
    check.add_argument("--id-columns", default="auto",
                       help="columns left out as row IDs: auto, none, or header names (setting "
                       "id-columns)")
    check.add_argument("--categories", default="",
                       help="declared category values, 'plan=basic|premium; region=n|s' "
                       "(setting categories; default: the values the files hold)")
    check.add_argument("--val-fraction", type=float, default=0.2,
                       help="a file without validation rows: the share of training rows its "
                       "node sets aside (setting val-fraction)")


def _add_split(sub: argparse._SubParsersAction) -> None:
    """``gems-fl split``."""
    split = sub.add_parser(
        "split", help="cut one CSV table into simulated sites' files, to rehearse a federation",
        description="Hold out a stratified, seeded test-fraction of FILE's rows as test.csv, "
        "divide the rest among --sites site files by a label division (the divisions the "
        "bundled datasets take; Dirichlet by default), and write them to --out with the "
        "table's header and cells. Then check them with gems-fl check-data, run them with "
        "gems-fl run --site, score the model with gems-fl predict on test.csv.")
    split.add_argument("file", help="the table: a .csv, one row per sample")
    split.add_argument("--sites", type=int, default=5, help="number of sites (default 5)")
    split.add_argument("--division", default=DEFAULT_DIVISION,
                       help=f"label division (default {DEFAULT_DIVISION}; dirichlet:ALPHA, iid, "
                       "classes-per-node:N or groups such as 0,1/2,3)")
    split.add_argument("--seed", type=int, default=0, help="seed of the hold-out and division")
    split.add_argument("--test-fraction", type=float, default=0.2,
                       help="share of rows held out as test.csv, per class (default 0.2)")
    split.add_argument("--label-column", default="",
                       help="the label column: header name or number counted from 0 (default last)")
    split.add_argument("--out", default=None,
                       help="folder for the files (default: <file stem>-sites beside the table)")


def _add_predict(sub: argparse._SubParsersAction) -> None:
    """``gems-fl predict``."""
    predict = sub.add_parser(
        "predict", help="score a finished run's model on your own rows (a .csv or .npz)",
        description="Load the model of RUN_FOLDER (<output-dir>/run-<id>) and predict FILE's "
        "rows: columns are matched by name where the file has a header (any order; others "
        "left out and named), else by position. With a label column (named, or found: the one "
        "column beyond the model's that is not an ID) it prints the accuracy, a per-class table "
        "and the confusion counts. Writes each row's predicted class and class probabilities "
        "to a CSV. Exit 0, or 2 with a message naming what to fix.")
    predict.add_argument("run_folder", help="a finished run's folder (or its results.json)")
    predict.add_argument("file", help="the rows to score: .csv (header optional) or .npz "
                         "(x_test and y_test, or x and optional y; columns for names)")
    predict.add_argument("--label-column", default="",
                         help="the label column: header name or number counted from 0 (default: "
                         "found as described above)")
    predict.add_argument("--out", default=None,
                         help="where to write the predictions CSV (default: "
                         "RUN_FOLDER/predictions-<file stem>.csv)")

def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gems-fl`` console script."""
    try:
        return _command(argv)
    except BrokenPipeError:  # the reader left (``gems-fl predict ... | head``): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a process ended by SIGPIPE


def _command(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    extra = {command.name: command for command in commands()}
    if args.command in extra:
        return extra[args.command].run(args, argv)
    handlers = {"show": lambda a: _show(a.path, a.markdown, a.plot), "check-data": _check_data,
                "split": _split, "predict": _predict, "submit": _submit, "pull": _pull,
                "status": _status}
    return handlers.get(args.command, _run)(args)


def _check_data(args: argparse.Namespace) -> int:
    from gems_fl.running.check_data import check_data

    return check_data(args.file, features=args.features, classes=args.classes,
                      label_column=args.label_column, id_columns=args.id_columns,
                      val_fraction=args.val_fraction, categories=args.categories)


def _predict(args: argparse.Namespace) -> int:
    from gems_fl.running.predict import predict_file

    return predict_file(args.run_folder, args.file, args.label_column, args.out)


def _submit(args: argparse.Namespace) -> int:
    from gems_fl.running.submit import submit

    link = args.superlink
    if args.detach:
        def detached() -> str:
            run_id = submit(args.app, link, args.run_config, output_dir=args.output_dir,
                            detach=True)
            return "\n".join([
                f"gems-fl: run {run_id} started on '{link}' and left running",
                f"  follow it:      flwr log {run_id} {link} --stream   (or gems-fl status "
                f"--superlink {link})",
                f"  stop it:        flwr stop {run_id} {link}",
                f"  results, after: gems-fl pull {run_id} --superlink {link} --output-dir "
                f"{args.output_dir}"])
        return report(detached)
    return report(lambda: submit(args.app, link, args.run_config, output_dir=args.output_dir,
                                  progress=True, verbose=args.verbose), where=f" on '{link}'")


def _pull(args: argparse.Namespace) -> int:
    from gems_fl.running.submit import pull

    def pulled() -> str:
        path = pull(args.run_id, args.superlink, args.output_dir, args.app)
        return f"gems-fl: results of run {args.run_id} written to {path}"
    return report(pulled)


def _status(args: argparse.Namespace) -> int:
    from gems_fl.running.status import status

    return report(lambda: "\n".join(status(args.superlink)))


def _split(args: argparse.Namespace) -> int:
    from pathlib import Path

    out = Path(args.out) if args.out else Path(args.file).with_name(f"{Path(args.file).stem}-sites")
    try:
        print(split_summary(args.file, args.sites, out, args.division, args.seed,
                            args.test_fraction, args.label_column)[0])
    except ValueError as exc:
        print(f"gems-fl: error: {exc}", file=sys.stderr)
        return 2
    return 0


def split_summary(file, sites: int, out, division: str, seed: int, test_fraction: float = 0.2,
                  label_column: str = "", next_steps: bool = True):
    """Split the table (:func:`gems_fl.data.table_split.split_table`): what it wrote, in
    words, and the :class:`~gems_fl.data.table_split.TableSplit`."""
    from gems_fl.data.table_split import split_table

    done = split_table(file, sites, out, division=division, seed=seed,
                       test_fraction=test_fraction, label_column=label_column)
    total = sum(sum(c.values()) for c in done.counts) + done.test_rows
    width = max(len(p.name) for p in done.sites)
    lines = [f"gems-fl split: {file} ({total} rows, {len(done.classes)} classes) into "
             f"{len(done.sites)} sites by {division} (seed {seed}) in {out}"]
    for path, counts in zip(done.sites, done.counts):
        lines.append(f"  {path.name:<{width}}  {sum(counts.values()):>6} rows  "
                     + ", ".join(f"{c} {n}" for c, n in counts.items()))
    if done.test is not None:
        lines.append(f"  {done.test.name:<{width}}  {done.test_rows:>6} rows  held out: score the "
                     "run's model on them with gems-fl predict")
    lines += [f"  note: {n}" for n in done.notes]
    if next_steps:
        files = " ".join(str(p) for p in done.sites)
        lines += ["next:", f"  gems-fl check-data {files}",
                  "  gems-fl run " + " ".join(f"--site {p}" for p in done.sites)]
        if done.test is not None:
            lines.append(f"  gems-fl predict gems-results/run-<id> {done.test}")
    return "\n".join(lines), done


def _run(args: argparse.Namespace) -> int:
    if args.table:
        if args.site:
            print("gems-fl: error: --table makes the sites' files; leave --site out",
                  file=sys.stderr)
            return 2
        try:
            args.site = _table_sites(args)
        except ValueError as exc:
            print(f"gems-fl: error: {exc}", file=sys.stderr)
            return 2
    if args.site and args.nodes is not None and args.nodes != len(args.site):
        print(f"gems-fl: error: --nodes {args.nodes} but {len(args.site)} --site files: each "
              "site file is one node; leave --nodes out", file=sys.stderr)
        return 2
    nodes = args.nodes if args.nodes is not None else 5
    def work():
        from gems_fl.running.prepare import prepare_run

        prepared = prepare_run(args.app, num_nodes=nodes, run_config=args.run_config,
                               output_dir=args.output_dir, sites=args.site)
        from gems_fl.running.launch import run_app  # torch, Flower: only for a valid run
        from gems_fl.running.outcome import RunIncomplete

        try:
            outcome = run_app(prepared=prepared, cpus_per_node=args.cpus_per_node,
                              ray_address=args.ray_address, progress=True,
                              verbose=args.verbose)
        except RunIncomplete as exc:
            if args.plot:
                _plot(exc.results_path)
            raise
        if args.plot:
            _plot(outcome.results_path)
        return outcome

    return report(work)


def _table_sites(args: argparse.Namespace) -> list[str]:
    """``--table``: the table cut into ``--nodes`` site files under the output folder, by
    the run's seed and label column."""
    from pathlib import Path

    from gems_fl.running.run_config import parse_run_config
    from gems_fl.settings import Settings

    given = {**Settings().to_config(), **parse_run_config(args.run_config)}
    nodes = args.nodes if args.nodes is not None else 5
    out = Path(args.output_dir or given["output-dir"]) / f"{Path(args.table).stem}-sites"
    text, done = split_summary(args.table, nodes, out, args.division, int(given["seed"]),
                               label_column=str(given["label-column"]), next_steps=False)
    print(text)
    print(f"gems-fl: after the run, score h_G on the held-out rows: gems-fl predict "
          f"<the run's folder> {out / 'test.csv'}")
    args.nodes = None
    return [str(p) for p in done.sites]


def _plot(results_path) -> None:
    """``--plot``: the run's picture beside its results (a note when it has none)."""
    import json
    from pathlib import Path

    from gems_fl.evaluation.result_plot import PLOT_FILE, plot_run

    path = Path(results_path)
    try:
        written = plot_run(json.loads(path.read_text()), path.parent / PLOT_FILE)
    except (OSError, ValueError) as exc:
        print(f"gems-fl: no picture: {exc}", file=sys.stderr)
        return
    print(f"gems-fl: picture: {written}")


def _sites_roll(results_path) -> str:
    """The results' line of the sites expected and heard from ("" without one)."""
    import json
    from pathlib import Path

    try:
        return str(json.loads(Path(results_path).read_text()).get("attendance", {}).get("roll", ""))
    except (OSError, ValueError, TypeError):
        return ""


def report(work, where: str = "") -> int:
    """Run ``work`` and turn its outcome or error into the last lines and the exit code
    that every ``gems-fl`` command shares."""
    from gems_fl.running.outcome import RunFailed, RunIncomplete, RunInterrupted
    from gems_fl.running.timing import timing_line

    try:
        outcome = work()
    except (SettingsError, ValueError, FileNotFoundError) as exc:
        print(f"gems-fl: error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(f"gems-fl: {exc}", file=sys.stderr)
        return exc.exit_code
    except RunIncomplete as exc:
        sys.stdout.flush()
        roll = _sites_roll(exc.results_path)
        if roll and roll not in str(exc):  # the sites expected and heard from, as on success
            print(f"gems-fl: sites: {roll}", file=sys.stderr)
        print(f"gems-fl: {exc}; results (status {exc.status}) in {exc.results_path}",
              file=sys.stderr)
        return exc.exit_code
    except RunFailed as exc:
        sys.stdout.flush()
        lines = [f"gems-fl: run failed: {exc}" + (":" if exc.errors else "")]
        lines += exc.errors
        if exc.log_path is not None:
            lines.append(f"gems-fl: full log: {exc.log_path}")
        print("\n".join(lines), file=sys.stderr)
        return 1
    if isinstance(outcome, str):
        print(outcome)
        return 0
    sites = outcome.results.get("attendance", {}).get("line", "completed")
    if outcome.results.get("attendance", {}).get("roll"):
        print(f"gems-fl: sites: {outcome.results['attendance']['roll']}")
    print(f"gems-fl: run {outcome.run_id}{where} {sites}; results in {outcome.results_path}"
          + (f" (log: {outcome.log_path})" if outcome.log_path else ""))
    print(f"gems-fl: time: {timing_line(outcome.results.get('timing_s', {}))}")
    return 0


def _show(path: str, markdown: bool, plot: bool = False) -> int:
    import json
    from pathlib import Path

    from gems_fl.evaluation.results import markdown_table, print_results

    if Path(path).is_dir():  # a run's folder: its results.json
        path = str(Path(path) / "results.json")
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"gems-fl: error: cannot read results from {path}: {exc}", file=sys.stderr)
        return 2
    if markdown:
        print(markdown_table(results))
    else:
        print_results(results)
    if plot:
        _plot(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
