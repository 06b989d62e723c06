#!/usr/bin/env python3
"""The Polars peer of `dlrec etl` with configs/etl_criteo.json (issue 24).

Same work as dlrec on a Criteo-layout TSV (label, I1..I13, C1..C26 as hex keys):
  - dense: FillMissing(0), Clip(min 0), LogOp (log1p), as float32;
  - categorical: Categorify with freq_threshold 15, fitted on the training rows (the first
    rows - floor(rows * valid_ratio), dlrec's split): id 0 missing, 1 out of vocabulary or rarer
    than 15, 2.. the vocabulary, most frequent first, ties by the smaller key (docs/ETL.md);
  - output: the training and validation rows, label float32, dense float32, ids uint32, as
    Parquet (uncompressed by default, as dlrec's shards are; --compression to change it).

Written as one would with Polars: the TSV is scanned lazily once (hex keys parsed to integers
and the dense ops applied in the scan, on all cores), kept in memory like dlrec's input cache,
the 26 vocabularies are fitted as one batch of lazy group-bys (collect_all runs them in
parallel), and the transform is one lazy query per split streamed into its Parquet file.

Prints one line like `dlrec bench etl`: input MB, seconds, MB/s, CPU seconds (user + sys of
all threads, from getrusage), MB per CPU second and peak RSS; the import of polars is not
timed (dlrec's process start is not either).

  python3 bench/polars_criteo_etl.py --data x.tsv --out DIR [--valid-ratio 0.1]
         [--threads N] [--compression uncompressed|zstd|lz4|snappy]
"""
import argparse
import math
import os
import resource
import sys
import time

FREQ_THRESHOLD = 15
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def run(args):
    import polars as pl  # after POLARS_MAX_THREADS is set

    t0, c0 = time.perf_counter(), cpu_seconds()
    schema = {"label": pl.Int32, **{c: pl.Int64 for c in DENSE}, **{c: pl.String for c in CATS}}
    raw = pl.scan_csv(args.data, separator="\t", has_header=False, schema=schema,
                      quote_char=None)
    parsed = raw.select(
        pl.col("label").cast(pl.Float32),
        *[pl.col(c).fill_null(0).clip(lower_bound=0).cast(pl.Float32).log1p() for c in DENSE],
        *[pl.col(c).str.to_integer(base=16, dtype=pl.UInt64) for c in CATS],
    ).collect(engine="streaming")
    t_parse = time.perf_counter()

    rows = parsed.height
    n_train = rows - math.floor(rows * args.valid_ratio)
    train = parsed.lazy().slice(0, n_train)
    vocab_queries = [
        train.group_by(c)
        .len()
        .filter(pl.col(c).is_not_null() & (pl.col("len") >= FREQ_THRESHOLD))
        .sort(["len", c], descending=[True, False])
        .select(pl.col(c), pl.int_range(2, pl.len() + 2, dtype=pl.UInt32).alias("id"))
        for c in CATS
    ]
    vocabs = dict(zip(CATS, pl.collect_all(vocab_queries)))
    t_fit = time.perf_counter()

    def encoded(c):
        v = vocabs[c]
        return (pl.when(pl.col(c).is_null())
                .then(pl.lit(0, pl.UInt32))
                .otherwise(pl.col(c).replace_strict(v[c], v["id"], default=1,
                                                    return_dtype=pl.UInt32))
                .alias(c))

    transformed = parsed.lazy().with_columns(*[encoded(c) for c in CATS])
    os.makedirs(args.out, exist_ok=True)
    splits = [("train", 0, n_train), ("valid", n_train, rows - n_train)]
    pl.collect_all([
        transformed.slice(start, n).sink_parquet(
            os.path.join(args.out, f"{name}.parquet"), compression=args.compression, lazy=True)
        for name, start, n in splits
    ])
    t_end, c_end = time.perf_counter(), cpu_seconds()

    mb = os.path.getsize(args.data) / 1e6
    secs, cpu = t_end - t0, c_end - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"polars etl: input={mb:.1f}MB rows={rows} threads={pl.thread_pool_size()} "
          f"seconds={secs:.2f} MB/s={mb / secs:.1f} cpu_seconds={cpu:.2f} "
          f"MB/cpu_s={mb / max(cpu, 1e-9):.1f} peak_rss={peak:.0f}MB "
          f"(parse {t_parse - t0:.2f}s, fit {t_fit - t_parse:.2f}s, "
          f"transform+write {t_end - t_fit:.2f}s; vocabulary sizes "
          f"{sum(v.height for v in vocabs.values())}) polars={pl.__version__}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="Criteo-layout TSV")
    ap.add_argument("--out", required=True, help="output folder (train.parquet, valid.parquet)")
    ap.add_argument("--valid-ratio", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=0, help="POLARS_MAX_THREADS (0: all cores)")
    ap.add_argument("--compression", default="uncompressed",
                    choices=["uncompressed", "zstd", "lz4", "snappy"])
    args = ap.parse_args()
    if not 0 <= args.valid_ratio < 1:
        sys.exit(f"--valid-ratio must be in [0, 1), got {args.valid_ratio}")
    if args.threads > 0:
        os.environ["POLARS_MAX_THREADS"] = str(args.threads)
    run(args)


if __name__ == "__main__":
    main()
