"""What a Spec-Bench run reports: per-category and overall summaries of the harness's records, the
Markdown table and its notes, two plots, and ``results.json`` / ``results.md``; run as a module it
redraws a finished run's plots (``python -m medusa_lite.bench.report RESULTS OUT_DIR``)."""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Sequence
from pathlib import Path

from medusa_lite.bench.harness import LABELS, METHODS, SHORT
from medusa_lite.bench.questions import categories_in_order
from medusa_lite.errors import MedusaError
from medusa_lite.trees.dynamic_tree import DynamicTree
from medusa_lite.trees.tree import Tree

OVERALL = "overall"


def method_summary(records: Sequence[dict], method: str) -> dict:
    runs = [record["methods"][method] for record in records]
    plain_seconds = sum(record["methods"]["plain"]["seconds"] for record in records)
    kernel_seconds = sum(
        record["methods"]["plain_kernel"]["seconds"] for record in records if "plain_kernel" in record["methods"]
    )
    tokens, seconds, calls = (sum(run[key] for run in runs) for key in ("new_tokens", "seconds", "target_calls"))
    summary = {
        "questions": len(runs),
        "new_tokens": tokens,
        "seconds": seconds,
        "target_calls": calls,
        "mean_accepted_tokens": tokens / calls if calls else 0.0,
        # Spec-Bench's count: per decoding step, each question's prefill and the token it yields left out
        "mean_tokens_per_step": (tokens - len(runs)) / (calls - len(runs)) if calls > len(runs) else 0.0,
        "tokens_per_second": tokens / seconds if seconds else 0.0,
        "speedup": plain_seconds / seconds if seconds else 0.0,
        "identical_fraction": sum(run["identical_to_plain"] for run in runs) / len(runs) if runs else 0.0,
    }
    if kernel_seconds:
        summary["speedup_vs_plain_kernel"] = kernel_seconds / seconds if seconds else 0.0
    speedups = question_speedups(records, method)
    if speedups:
        slowest = min(speedups, key=speedups.get)
        summary["min_question_speedup"], summary["slowest_question"] = speedups[slowest], slowest
    steps = sum(run["steps"] for run in runs)
    if steps:
        summary["steps"] = steps
        summary["lookup_step_fraction"] = sum(run.get("lookup_steps", 0) for run in runs) / steps
        summary["datastore_step_fraction"] = sum(run.get("datastore_steps", 0) for run in runs) / steps
        summary["mean_verified_rows"] = sum(run.get("verified_rows", 0) for run in runs) / steps
        depth = max(len(run["accepted_at_depth"]) for run in runs)
        accepted = [
            sum(run["accepted_at_depth"][d] for run in runs if d < len(run["accepted_at_depth"])) for d in range(depth)
        ]
        summary["acceptance_rate_by_depth"] = [count / steps for count in accepted]
    return summary


def question_speedups(records: Sequence[dict], method: str) -> dict:
    """{question id: plain's seconds / the method's seconds} for each question."""
    return {
        record["question_id"]: record["methods"]["plain"]["seconds"] / record["methods"][method]["seconds"]
        for record in records
        if record["methods"][method]["seconds"] > 0
    }


def methods_in(records: Sequence[dict]) -> list[str]:
    """The methods the records hold, in ``METHODS`` order."""
    present = set(records[0]["methods"]) if records else set()
    return [method for method in METHODS if method in present]


def summarize(records: Sequence[dict]) -> dict[str, dict[str, dict]]:
    """{category or "overall": {method: summary}}."""
    groups = {category: [r for r in records if r["category"] == category] for category in categories_in_order(records)}
    groups[OVERALL] = list(records)
    return {
        name: {method: method_summary(group, method) for method in methods_in(records)}
        for name, group in groups.items()
    }


def markdown_table(summary: dict[str, dict[str, dict]]) -> str:
    compared = [method for method in next(iter(summary.values())) if method != "plain"]
    header = (
        "| category | n | plain tok/s | "
        + " | ".join(
            f"{SHORT[m]} acc. | {SHORT[m]} tok/s | {SHORT[m]} speed-up | {SHORT[m]} identical" for m in compared
        )
        + " |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for name, methods in summary.items():
        plain = methods["plain"]
        label = f"**{name}**" if name == OVERALL else name
        cells = [
            f"{r['mean_accepted_tokens']:.2f} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | "
            f"{r['identical_fraction']:.0%}"
            for r in (methods[m] for m in compared)
        ]
        lines.append(
            f"| {label} | {plain['questions']} | {plain['tokens_per_second']:.1f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def per_step_line(summary: dict[str, dict[str, dict]]) -> str:
    """Overall tokens per decoding step as Spec-Bench counts them (the published numbers' unit)."""
    overall = summary[OVERALL]
    values = ", ".join(f"{SHORT[m]} {r['mean_tokens_per_step']:.2f}" for m, r in overall.items() if m != "plain")
    return (
        f"Overall tokens per decoding step as Spec-Bench counts them (each prefill and its token left out): {values}."
    )


def kernel_line(summary: dict[str, dict[str, dict]]) -> str:
    """Overall speed-ups over plain decoding through the packed path (empty without ``plain_kernel``)."""
    overall = summary[OVERALL]
    if "plain_kernel" not in overall:
        return ""
    values = ", ".join(
        f"{SHORT[m]} {r['speedup_vs_plain_kernel']:.2f}x"
        for m, r in overall.items()
        if m not in ("plain", "plain_kernel")
    )
    return (
        f"Overall speed-up over plain generate with its one-token steps through the packed path "
        f"(machine.prepack_backend in results.json) "
        f"({overall['plain_kernel']['speedup']:.2f}x plain's speed by itself): {values}."
    )


def slowest_line(summary: dict[str, dict[str, dict]]) -> str:
    """Each method's speed-up over plain on its slowest question (the per-question minimum)."""
    overall = summary[OVERALL]
    values = ", ".join(
        f"{SHORT[m]} {r['min_question_speedup']:.2f}x (question {r['slowest_question']})"
        for m, r in overall.items()
        if m != "plain" and "min_question_speedup" in r
    )
    return f"Slowest question's speed-up over plain: {values}." if values else ""


def plot_speedup(summary: dict[str, dict[str, dict]], path: Path) -> None:
    names = list(summary)
    positions = range(len(names))
    from matplotlib.figure import Figure  # the object API: no pyplot, no GUI backend

    figure = Figure(figsize=(max(6, 0.7 * len(names) + 2), 4))
    axes = figure.subplots()
    compared = [method for method in summary[names[0]] if method != "plain"]
    width = 0.8 / len(compared)
    for index, method in enumerate(compared):
        offset = (index - (len(compared) - 1) / 2) * width
        bars = axes.bar(
            [p + offset for p in positions],
            [summary[n][method]["speedup"] for n in names],
            width,
            label=LABELS[method],
        )
        axes.bar_label(bars, fmt="%.2f", fontsize=7)
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.set_xticks(list(positions), names, rotation=45, ha="right")
    axes.set_ylabel("speed-up vs plain generate")
    axes.set_title("Spec-Bench speed-up by category")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot_acceptance(summary: dict[str, dict[str, dict]], path: Path) -> None:
    method = (
        next(m for m in ("medusa", "heads") if m in summary[OVERALL])
        if {"medusa", "heads"} & set(summary[OVERALL])
        else None
    )
    rates = summary[OVERALL][method].get("acceptance_rate_by_depth", []) if method else []
    from matplotlib.figure import Figure  # the object API: no pyplot, no GUI backend

    figure = Figure(figsize=(5, 3.5))
    axes = figure.subplots()
    depths = [d + 1 for d in range(len(rates))]
    axes.bar_label(axes.bar(depths, rates), fmt="%.2f")
    axes.set_xticks(depths)
    axes.set_xlabel("tree depth (head)")
    axes.set_ylabel("fraction of steps accepting a guess")
    axes.set_ylim(0, 1)
    axes.set_title(f"{LABELS[method] if method else 'medusa-lite'}: acceptance by depth")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def write_outputs(out: Path, summary: dict, records: Sequence[dict], settings: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps({**settings, "summary": summary, "questions": list(records)}, indent=1) + "\n", encoding="utf-8"
    )
    machine = settings["machine"]
    heading = (
        f"Spec-Bench, {settings['num_questions']} questions, greedy, max {settings['max_new_tokens']} new tokens; "
        f"{machine['cpu']}, {machine['torch_threads']} threads, {machine['dtype']}; "
        f"{'dynamic tree of up to' if settings.get('dynamic_tree') else 'tree of'} {settings['tree_nodes']} "
        "nodes; "
        f"torch {machine['torch']}, transformers {machine['transformers']}; {machine['date']}.\n"
        "acc. = mean accepted tokens per target call (bonus and prefill counted; plain = 1.00); "
        "speed-up = plain's total time / the method's; identical = outputs token-identical to plain greedy.\n\n"
    )
    lines = [per_step_line(summary), kernel_line(summary), slowest_line(summary)]
    (out / "results.md").write_text(
        heading + markdown_table(summary) + "\n\n" + "\n\n".join(line for line in lines if line) + "\n",
        encoding="utf-8",
    )
    plot_speedup(summary, out / "speedup_by_category.png")
    plot_acceptance(summary, out / "acceptance_by_depth.png")


def tree_settings(tree: Tree | DynamicTree) -> dict:
    """How ``results.json`` records the tree medusa decoded with."""
    if isinstance(tree, DynamicTree):
        return {"tree_nodes": tree.num_nodes, "tree": None, "dynamic_tree": tree.as_dict()}
    return {"tree_nodes": tree.num_nodes, "tree": [list(path) for path in tree.paths], "dynamic_tree": None}


def read_results(path: Path) -> dict:
    """A run's ``results.json`` (or the ``.json.gz`` the large ones are committed as)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def replot(results: Path, out: Path) -> list[Path]:
    """Redraw a finished run's two plots from its ``results.json`` into ``out``, where the
    committed sub-runs keep no PNGs; returns the files written."""
    summary = read_results(results).get("summary") or {}
    if OVERALL not in summary:
        raise MedusaError(f"{results} holds no Spec-Bench summary with an {OVERALL!r} row: nothing to plot")
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "speedup_by_category.png", out / "acceptance_by_depth.png"]
    plot_speedup(summary, written[0])
    plot_acceptance(summary, written[1])
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m medusa_lite.bench.report", description="Redraw a Spec-Bench run's plots from its results.json."
    )
    parser.add_argument("results", type=Path, help="results.json or results.json.gz of a finished run")
    parser.add_argument("out", type=Path, help="folder to write the two PNGs into")
    args = parser.parse_args(argv)
    for path in replot(args.results, args.out):
        print(path)


if __name__ == "__main__":
    main()
