#!/usr/bin/env python3
"""Summary table of bench/gpu_headline.sh's results (results.tsv) as markdown.

results.tsv: one line per figure a run printed, tab-separated:
    round  build  figure  metric  value
build is "new", "old" or "pytorch"; figure a key such as dlrm_bf16_32768 or infer_2048; metric
ms (training step), p50 / p99 (inference call, microseconds) or samples_s. Lower is better for
ms, p50 and p99. Per figure the table gives each build's median over the rounds (with the range
and the count), new against old (issue 17: new within 2 % of old for training, 5 % for
inference, measured side by side in one call) and new against the PyTorch peer of the same call.

    python3 bench/headline_summary.py results.tsv [--env env.txt] [--notes notes.txt] > summary.md
"""
import argparse
import statistics
import sys

# (figure key, label, metric compared, tolerance for new vs old, peer figure key or None)
FIGURES = [
    ("dlrm_bf16_32768", "MLPerf DLRM bf16, batch 32768 (ms/step)", "ms", 0.02, "dlrm_bf16_32768"),
    ("dlrm_bf16_55296", "MLPerf DLRM bf16, batch 55296 (ms/step)", "ms", 0.02, "dlrm_bf16_55296"),
    ("dlrm_fp16_32768", "MLPerf DLRM fp16, batch 32768 (ms/step; peer: PyTorch bf16)", "ms", 0.02,
     "dlrm_bf16_32768"),
    ("dlrm_fp16_55296", "MLPerf DLRM fp16, batch 55296 (ms/step; peer: PyTorch bf16)", "ms", 0.02,
     "dlrm_bf16_55296"),
    ("dcnv2_bf16_55296", "DCNv2 bf16, batch 55296 (ms/step)", "ms", 0.02, "dcnv2_bf16_55296"),
    ("dcnv2_fp16_55296", "DCNv2 fp16, batch 55296 (ms/step)", "ms", 0.02, None),
    ("deepfm_bf16_16384", "DeepFM bf16 Adagrad, batch 16384 (ms/step)", "ms", 0.02, None),
    ("deepfm_fp16_16384", "DeepFM fp16 Adagrad, batch 16384 (ms/step)", "ms", 0.02, None),
    ("widedeep_bf16_16384", "Wide&Deep bf16 Adagrad, batch 16384 (ms/step)", "ms", 0.02, None),
    ("infer_1", "`bench infer` batch 1, p50 (µs)", "p50", 0.05, "infer_1"),
    ("infer_2048", "`bench infer` batch 2048, p50 (µs)", "p50", 0.05, "infer_2048"),
    ("infer_32768", "`bench infer` batch 32768, p50 (µs)", "p50", 0.05, "infer_32768"),
    ("infer_1", "`bench infer` batch 1, p99 (µs; shown, not judged)", "p99", None, "infer_1"),
    ("infer_2048", "`bench infer` batch 2048, p99 (µs; shown, not judged)", "p99", None,
     "infer_2048"),
    ("infer_32768", "`bench infer` batch 32768, p99 (µs; shown, not judged)", "p99", None,
     "infer_32768"),
    # gRPC end to end (--parts e2e): shown, not judged (tails move with the host's scheduling).
    ("e2e_live", "gRPC e2e ServerLive floor, p99 (µs)", "p99", None, None),
    ("e2e_1x1", "gRPC e2e batch 1, p50 (µs)", "p50", None, None),
    ("e2e_1x1", "gRPC e2e batch 1, p99 (µs)", "p99", None, None),
    ("e2e_2048x1", "gRPC e2e batch 2048, p50 (µs)", "p50", None, None),
    ("e2e_2048x1", "gRPC e2e batch 2048, p99 (µs)", "p99", None, None),
    ("e2e_4096x32", "gRPC e2e 4096 × 32 clients (samples/s, higher is better)", "samples_s",
     None, None),
    ("e2e_16384x16", "gRPC e2e 16384 × 16 clients (samples/s, higher is better)", "samples_s",
     None, None),
    ("e2e_16384x32", "gRPC e2e 16384 × 32 clients (samples/s, higher is better)", "samples_s",
     None, None),
]


def read_results(path):
    """{(build, figure, metric): [values in round order]}; malformed lines are an error."""
    values = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) != 5:
                sys.exit(f"{path}:{n}: expected 5 tab-separated fields, got {len(parts)}: {line!r}")
            _, build, figure, metric, value = parts
            try:
                v = float(value)
            except ValueError:
                sys.exit(f"{path}:{n}: value {value!r} is not a number")
            values.setdefault((build, figure, metric), []).append(v)
    return values


def fmt(v, metric):
    if metric == "samples_s":
        return f"{v / 1e6:,.2f} M"
    return f"{v:,.3f}" if metric == "ms" else f"{v:,.1f}"


def cell(vals, metric):
    if not vals:
        return "—"
    m = statistics.median(vals)
    if len(vals) == 1:
        return f"{fmt(m, metric)} (n=1)"
    return (f"**{fmt(m, metric)}** ({fmt(min(vals), metric)}–{fmt(max(vals), metric)}, "
            f"n={len(vals)})")


def table(values):
    rows = ["| figure | new | old | new vs old | issue 17 check | PyTorch, same call | "
            "new vs PyTorch |", "| --- | --- | --- | --- | --- | --- | --- |"]
    verdicts = []
    for key, label, metric, tol, peer in FIGURES:
        new = values.get(("new", key, metric), [])
        old = values.get(("old", key, metric), [])
        torch = values.get(("pytorch", peer, metric), []) if peer else []
        if not new and not old:
            continue
        change = check = "—"
        if old and not new and tol is not None:
            check = "**NO FIGURE** from new"
            verdicts.append((label, False))
        if new and old:
            ratio = statistics.median(new) / statistics.median(old)
            change = f"{(ratio - 1) * 100:+.1f} %"
            if tol is not None:
                ok = ratio <= 1 + tol
                bound = f"{tol * 100:.0f} %"
                check = f"ok (≤ +{bound})" if ok else f"**SLOWER** (> +{bound})"
                verdicts.append((label, ok))
        speedup = "—"
        if new and torch:
            speedup = f"{statistics.median(torch) / statistics.median(new):.2f}×"
        rows.append(f"| {label} | {cell(new, metric)} | {cell(old, metric)} | {change} | {check} "
                    f"| {cell(torch, metric)} | {speedup} |")
    return rows, verdicts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--env", help="a file describing the machine and the builds (quoted as is)")
    ap.add_argument("--notes", help="a file of notes (failures, skipped parts), quoted as is")
    args = ap.parse_args()
    values = read_results(args.results)
    out = ["# GPU headline figures (bench/gpu_headline.sh)", ""]
    if args.env:
        with open(args.env) as f:
            out += ["```", f.read().rstrip(), "```", ""]
    rows, verdicts = table(values)
    out += ["Medians over the rounds (range, count). Lower is better. new vs old: the change of "
            "new's median against old's; issue 17 asks for new within +2 % (training) and +5 % "
            "(inference p50) of old, side by side in one call.", ""]
    out += rows + [""]
    if len(rows) == 2:
        out += ["No figure was recorded: every run failed or none ran (see the notes and logs).",
                ""]
    if verdicts:
        slower = [label for label, ok in verdicts if not ok]
        out.append("Verdict: " + ("every judged figure within its tolerance." if not slower
                                  else "outside the tolerance or missing: " + "; ".join(slower)
                                  + "."))
        out.append("")
    if args.notes:
        with open(args.notes) as f:
            notes = f.read().rstrip()
        if notes:
            out += ["## Notes", "", notes, ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
