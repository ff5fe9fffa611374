"""The lab's ``gems-fl`` subcommand: ``gems-fl reproduce`` (found by the product through
the ``gems_fl.commands`` entry point, :mod:`gems_fl.extensions`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from gems_fl.settings import SettingsError

__all__ = ["REPRODUCE", "parse_gram_ranks", "reproduce_command"]


@dataclass(frozen=True)
class _Reproduce:
    name: str = "reproduce"

    def add_parser(self, subparsers: argparse._SubParsersAction) -> None:
        rep = subparsers.add_parser(
            "reproduce",
            help="reproduce the paper's evaluation (tables, plots, JSON) on Fashion-MNIST",
            description="Run the paper's studies through the real GEMS apps in-process and "
            "write each study's markdown table (mean (std) over seeds), JSON and PNG plots to "
            "the output folder. Studies: 1 convex table, 2 NN table, 3 fine-tuning, 4 model "
            "size, 5 intersection analysis, 6 FedAvg/FedProx vs GEMS, 7 Dirichlet divisions "
            "(the Gram points, the paper's space, refinement rounds, FedAvg/FedProx with local "
            "SGD). Finished trials are kept "
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
        rep.add_argument("--fed-rounds", type=int, default=None,
                         help="study 6: FedAvg/FedProx rounds (default: 100, quick: 4)")
        rep.add_argument("--gram-ranks", default=None,
                         help="study 1's gram-rank sweep (convex K=5): comma-separated ranks, "
                         "'auto' or 0 (the whole matrix), e.g. 5,auto,0; 'none' skips the sweep "
                         "(default: 5,20,50,100,auto,0; quick: 5,auto,0)")
        rep.add_argument("--profile", choices=("product", "paper"), default="product",
                         help="product (default): the project's recipe, as in the committed "
                         "tables; paper: the paper's recipe in every trial (setting profile: "
                         "its floors, neuron criterion and tuning), stored as separate trials")
        rep.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
        rep.add_argument("--fresh", action="store_true", help="discard stored trials and cache")

    def run(self, args: argparse.Namespace, argv: list[str] | None) -> int:
        return reproduce_command(args, argv)


def parse_gram_ranks(text: str) -> tuple[int | str, ...]:
    """``--gram-ranks``: the ranks of study 1's sweep (ValueError says what is wrong)."""
    if text.strip().lower() == "none":
        return ()
    ranks: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        if part == "auto":
            ranks.append(part)
        elif part.isdigit():
            ranks.append(int(part))
        else:
            raise ValueError(f"--gram-ranks {text!r}: {part!r} is not a rank; give ranks >= 0 "
                             "or 'auto' separated by commas (0 is the whole matrix), or 'none'")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"--gram-ranks {text!r} names a rank twice")
    return tuple(ranks)


def reproduce_command(args: argparse.Namespace, argv: list[str] | None) -> int:  # noqa: C901
    """``gems-fl reproduce``: run the studies, write the tables; the exit status."""
    from gems_lab.reproduce import Options, expected_files, reproduce

    try:
        studies = tuple(sorted({int(s) for s in args.studies.split(",") if s.strip()}))
    except ValueError:
        print(f"gems-fl: error: --studies {args.studies!r} must be numbers like 1,2,6",
              file=sys.stderr)
        return 2
    changes = {"studies": studies, "data_dir": args.data_dir, "profile": args.profile}
    if args.seeds is not None:
        if args.seeds < 1:
            print("gems-fl: error: --seeds must be >= 1", file=sys.stderr)
            return 2
        changes["seeds"] = tuple(range(args.seeds))
    if args.dataset:
        changes["dataset"] = args.dataset
    if args.fed_rounds is not None:
        if args.fed_rounds < 1:
            print("gems-fl: error: --fed-rounds must be >= 1", file=sys.stderr)
            return 2
        changes["fed_rounds"] = args.fed_rounds
    if args.gram_ranks is not None:
        try:
            changes["gram_ranks"] = parse_gram_ranks(args.gram_ranks)
        except ValueError as exc:
            print(f"gems-fl: error: {exc}", file=sys.stderr)
            return 2
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


REPRODUCE = _Reproduce()
