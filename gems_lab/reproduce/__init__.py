"""``gems-fl reproduce``: the paper's evaluation (section 4, appendix C) in one command.

:func:`reproduce` builds the trial plan of the chosen studies (:mod:`.plan`), runs the
trials through the real apps (:mod:`.runner`) and writes every study's markdown table,
JSON and PNG plot, plus ``README.md`` and ``results.json`` with all of them
(:mod:`.report`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from gems_fl.geometry.choices import kind_traits
from gems_fl.settings import Settings
from gems_lab.reproduce.plan import STUDIES, Options, build_plan
from gems_lab.reproduce.report import Report
from gems_lab.reproduce.report_dirichlet import dirichlet_section
from gems_lab.reproduce.report_federated import federated_section
from gems_lab.reproduce.runner import run_trials

__all__ = ["Options", "STUDIES", "commits_line", "expected_files", "reproduce"]


def expected_files(options: Options) -> list[str]:
    """The files a finished reproduction of ``options.studies`` must contain."""
    rank = (["study1_gram_rank.md", "study1_gram_rank.json", "study1_gram_rank.png"]
            if any(kind_traits(s).statistics for s in options.spaces) and options.gram_ranks else [])
    files = {1: ["study1_convex.md", "study1_convex.json", "study1_convex.png", *rank],
             2: ["study2_nn.md", "study2_nn.json", "study2_nn.png"],
             3: ["study3_fine_tuning.md", "study3_fine_tuning.json",
                 "study3_fine_tuning_logistic.png", "study3_fine_tuning_mlp.png"],
             4: ["study4_model_size.md", "study4_model_size.json", "study4_model_size.png"],
             5: ["study5_intersection.md", "study5_intersection.json", "study5_intersection.png"],
             6: ["study6_federated.md", "study6_federated.json", "study6_accuracy_vs_bytes.png"],
             7: ["study7_dirichlet.md", "study7_dirichlet.json", "study7_dirichlet.png"]}
    return [f for s in sorted(options.studies) for f in files[s]] + ["results.json", "README.md"]


def commits_line(records: list[dict]) -> str:
    """Which code computed the trials: each git commit (short) with its trial count, a
    commit with uncommitted changes marked, trials that recorded none counted apart."""
    counts: dict[str, int] = {}
    for record in records:
        commit = record.get("git_commit")
        name = ("not recorded" if not commit else
                f"`{commit[:7]}`" + (" with uncommitted changes" if record.get("git_dirty") else ""))
        counts[name] = counts.get(name, 0) + 1
    return "Trials computed at commit " + ", ".join(f"{name} ({n})" for name, n in counts.items())


def _defaults() -> dict:
    return Settings().to_config()


def reproduce(options: Options, out: Path, jobs: int = 2, fresh: bool = False,  # noqa: C901
              command: str = "") -> Path:
    """Run the studies of ``options`` into ``out``; return the summary README's path."""
    unknown = set(options.studies) - set(STUDIES)
    if unknown:
        raise ValueError(f"unknown studies {sorted(unknown)}; choose from {sorted(STUDIES)}")
    out = Path(out).expanduser().resolve()
    if fresh and out.exists():
        for sub in ("trials", "cache", "logs", "runs"):
            shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trials = build_plan(options)
    records, ran = run_trials(trials, out, jobs)
    wall = time.perf_counter() - t0
    meta = {"options": {k: getattr(options, k) for k in options.__dataclass_fields__},
            "defaults": _defaults(), "trials": len(trials), "wall_s": wall,
            "trial_compute_s": sum(r["wall_s"] for r in records), "jobs": jobs,
            "trials_run_now": ran,
            "commits": commits_line(records),
            "command": command}
    report = Report(out, records, meta)
    studies = set(options.studies)
    if 1 in studies:
        report.convex_table(options.setups(), list(options.spaces))
        report.gram_rank()
    if 2 in studies:
        report.nn_table(options.setups(), list(options.nn_spaces))
    if 3 in studies:
        report.fine_tuning()
    if 4 in studies:
        report.model_size()
    if 5 in studies:
        report.intersection(list(options.intersection_eps))
    if 6 in studies:
        federated_section(report)
    if 7 in studies:
        dirichlet_section(report, options)
    header = (f"# GEMS reproduction on {options.dataset}\n\n"
              f"Command: `{command or 'gems-fl reproduce'}`\n\n"
              + (f"{len(trials)} trials, seeds {list(options.seeds)}, {jobs} worker "
                 f"process(es). This invocation ran {ran} of them in {wall:.0f} s wall time; "
                 f"the others were already stored in {out / 'trials'} from an earlier "
                 f"invocation ({meta['trial_compute_s']:.0f} s of trial time in all).\n"
                 if ran < len(trials) else
                 f"{len(trials)} trials, seeds {list(options.seeds)}, {jobs} worker "
                 f"process(es); wall time {wall:.0f} s for all of them.\n")
              + f"\n{commits_line(records)}.\n")
    return report.write_summary(header)
