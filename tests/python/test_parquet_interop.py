"""Parquet interop with pyarrow, both ways, plus `dlrec etl` on Parquet input.

(a) pyarrow writes files (every encoding/compression/page version dlrec supports: PLAIN,
    dictionary, DELTA_*, BYTE_STREAM_SPLIT; SNAPPY, ZSTD, GZIP, LZ4_RAW, BROTLI; nulls, several
    row groups and pages, list columns) -> `dlrec parquet dump` prints identical values.
(b) `dlrec parquet write` writes files -> pyarrow reads identical values and schema.
(c) `dlrec etl` on a Parquet file gives the same dataset as on the same rows as CSV.
Needs the built `dlrec` (DLREC_BIN_DIR) and pyarrow; skips without pyarrow.
"""
import csv
import filecmp
import json
import math
import os
import random
import subprocess

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

BIN_DIR = os.environ.get("DLREC_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DLREC = os.path.join(BIN_DIR, "dlrec")


@pytest.fixture(scope="module", autouse=True)
def need_binary():
    if not os.path.exists(DLREC):
        pytest.skip(f"{DLREC} is not built")


def run(*args, ok=True):
    p = subprocess.run([DLREC, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise AssertionError(f"dlrec {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def dump(path):
    out = run("parquet", "dump", str(path)).stdout.splitlines()
    head = json.loads(out[0])
    return head, [json.loads(line) for line in out[1:]]


def from_json_value(v):
    """dlrec's JSON for non-finite floats -> Python floats."""
    if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity"):
        return float(v.replace("Infinity", "inf"))
    if isinstance(v, list):
        return [from_json_value(x) for x in v]
    return v


def same(a, b):
    """Equal values of equal Python types; NaN equals NaN; -0.0 differs from 0.0."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


def make_table(rows=530, seed=1):
    rnd = random.Random(seed)

    def maybe(v, p=0.2):
        return None if rnd.random() < p else v

    def lst(gen, p_null=0.15):
        if rnd.random() < p_null:
            return None
        return [maybe(gen(), 0.1) for _ in range(rnd.randrange(0, 5))]

    words = ["alpha", "beta", "gamma", "δέλτα", "", "e" * 40] + [f"w{i}" for i in range(30)]
    cols = {
        "b": [maybe(rnd.random() < 0.5) for _ in range(rows)],
        "i32": [maybe(rnd.randrange(-2**31, 2**31)) for _ in range(rows)],
        "i32_small": [rnd.randrange(0, 20) for _ in range(rows)],
        "i64": [maybe(rnd.randrange(-2**63, 2**63)) for _ in range(rows)],
        "i64_dict": [maybe(rnd.randrange(0, 50) * 10**12) for _ in range(rows)],
        "f32": [maybe(rnd.choice([0.5, -1.25, 3.0e20, 1e-30, float("inf"), 7.0]) * rnd.randrange(1, 9))
                for _ in range(rows)],
        "f64": [maybe(rnd.random() * 10**rnd.randrange(-5, 5)) for _ in range(rows)],
        "f64_nan": [maybe(rnd.choice([float("nan"), 1.5, -0.0])) for _ in range(rows)],
        "s": [maybe(rnd.choice(words)) for _ in range(rows)],
        "s_req": [rnd.choice(words) for _ in range(rows)],
        "bin": [maybe(bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 6)))) for _ in range(rows)],
        "l_i64": [lst(lambda: rnd.randrange(0, 1000)) for _ in range(rows)],
        "l_i32": [lst(lambda: rnd.randrange(-5, 5)) for _ in range(rows)],
        "l_f64": [lst(lambda: rnd.random()) for _ in range(rows)],
        "l_s": [lst(lambda: rnd.choice(words)) for _ in range(rows)],
    }
    schema = pa.schema([
        pa.field("b", pa.bool_()),
        pa.field("i32", pa.int32()),
        pa.field("i32_small", pa.int32(), nullable=False),
        pa.field("i64", pa.int64()),
        pa.field("i64_dict", pa.int64()),
        pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64()),
        pa.field("f64_nan", pa.float64()),
        pa.field("s", pa.string()),
        pa.field("s_req", pa.string(), nullable=False),
        pa.field("bin", pa.binary()),
        pa.field("l_i64", pa.list_(pa.int64())),
        pa.field("l_i32", pa.list_(pa.int32())),
        pa.field("l_f64", pa.list_(pa.float64())),
        pa.field("l_s", pa.list_(pa.string())),
    ])
    return pa.table(cols, schema=schema)


def type_word(t):
    """dlrec's name for a pyarrow type (of the elements, for lists)."""
    if pa.types.is_list(t):
        t = t.value_type
    return {pa.bool_(): "bool", pa.int32(): "int32", pa.int64(): "int64", pa.float32(): "float",
            pa.float64(): "double", pa.string(): "string", pa.binary(): "binary"}[t]


def expected_rows(table):
    rows = table.to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, bytes):
                r[k] = v.hex()
    return rows


def check_dump(path, table):
    head, rows = dump(path)
    assert head["num_rows"] == table.num_rows
    assert head["row_groups"] == pq.ParquetFile(path).metadata.num_row_groups
    names = [f["name"] for f in head["fields"]]
    assert names == table.column_names
    for f in head["fields"]:
        assert "unsupported" not in f
        tf = table.schema.field(f["name"])
        assert f["type"] == type_word(tf.type)
        assert f["list"] == pa.types.is_list(tf.type)
        assert f["nullable"] == tf.nullable
    want = expected_rows(table)
    assert len(rows) == len(want)
    for i, (w, g) in enumerate(zip(want, rows)):
        g = {k: from_json_value(v) for k, v in g.items()}
        for k in w:
            assert same(w[k], g[k]), f"row {i} column {k}: pyarrow {w[k]!r}, dlrec {g[k]!r}"


# ---- (a) pyarrow writes, dlrec reads

# pyarrow's names of the codecs in its metadata ('lz4' writes LZ4_RAW, which pyarrow calls LZ4).
CODEC_NAMES = {"none": "UNCOMPRESSED", "snappy": "SNAPPY", "zstd": "ZSTD", "gzip": "GZIP",
               "lz4": "LZ4", "brotli": "BROTLI"}


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip", "lz4", "brotli"])
@pytest.mark.parametrize("dictionary", [True, False])
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
def test_pyarrow_writes_dlrec_reads(tmp_path, compression, dictionary, page_version):
    table = make_table()
    path = tmp_path / "a.parquet"
    pq.write_table(table, path, compression=compression, use_dictionary=dictionary,
                   data_page_version=page_version, row_group_size=120, data_page_size=512)
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups == 5
    assert md.row_group(0).column(0).compression == CODEC_NAMES[compression]
    encodings = set()
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            encodings.update(md.row_group(g).column(c).encodings)
    if dictionary:
        assert "RLE_DICTIONARY" in encodings or "PLAIN_DICTIONARY" in encodings
    else:
        assert not ({"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & encodings)
    check_dump(path, table)


def test_pyarrow_legacy_options(tmp_path):
    """Parquet format 1.0 (PLAIN_DICTIONARY), no statistics, one big row group, per-column
    dictionary choice."""
    table = make_table(rows=300, seed=5)
    path = tmp_path / "legacy.parquet"
    pq.write_table(table, path, version="1.0", write_statistics=False,
                   use_dictionary=["s", "l_s", "i64_dict"], compression="snappy")
    check_dump(path, table)


def test_pyarrow_empty_and_all_null(tmp_path):
    table = pa.table({"x": pa.array([None] * 10, pa.int64()),
                      "l": pa.array([[]] * 5 + [None] * 5, pa.list_(pa.string()))})
    path = tmp_path / "nulls.parquet"
    pq.write_table(table, path)
    check_dump(path, table)
    empty = tmp_path / "empty.parquet"
    pq.write_table(table.slice(0, 0), empty)
    head, rows = dump(empty)
    assert head["num_rows"] == 0 and rows == []


# The columns of make_table() each encoding applies to (list columns by their leaf's path).
ENCODING_COLUMNS = {
    "DELTA_BINARY_PACKED": ["i32", "i32_small", "i64", "i64_dict", "l_i64.list.element",
                            "l_i32.list.element"],
    "DELTA_LENGTH_BYTE_ARRAY": ["s", "s_req", "bin", "l_s.list.element"],
    "DELTA_BYTE_ARRAY": ["s", "s_req", "bin", "l_s.list.element"],
    "BYTE_STREAM_SPLIT": ["f32", "f64", "f64_nan", "l_f64.list.element", "i32", "i64"],
}


@pytest.mark.parametrize("encoding", sorted(ENCODING_COLUMNS))
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_pyarrow_encodings_dlrec_reads(tmp_path, encoding, page_version, compression):
    """DELTA_* and BYTE_STREAM_SPLIT pages (nulls, lists, several pages and row groups)."""
    table = make_table(rows=900, seed=7)
    path = tmp_path / "enc.parquet"
    cols = ENCODING_COLUMNS[encoding]
    pq.write_table(table, path, compression=compression, use_dictionary=False,
                   column_encoding={c: encoding for c in cols}, data_page_version=page_version,
                   row_group_size=400, data_page_size=700)
    md = pq.ParquetFile(path).metadata
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(g).column(c)
            if col.path_in_schema in cols:
                assert encoding in col.encodings, (col.path_in_schema, col.encodings)
    check_dump(path, table)


def test_corrupt_gzip_page_is_one_clear_line(tmp_path):
    """A pyarrow GZIP file whose page stream is damaged (its trailer's CRC and length): one
    error line naming the file, row group, column, data page and codec."""
    table = pa.table({"a": pa.array(range(1000), pa.int64())})
    path = tmp_path / "gzip.parquet"
    pq.write_table(table, path, compression="gzip", use_dictionary=False)
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    end = col.data_page_offset + col.total_compressed_size  # one page: its stream ends here
    data = bytearray(path.read_bytes())
    for i in range(end - 8, end):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    p = run("parquet", "dump", str(path), ok=False)
    assert p.returncode == 1
    assert f"{path}: row group 0, column 'a': data page 0: corrupt GZIP data" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_corrupt_files_give_one_clear_line(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(make_table(rows=50), path)
    data = path.read_bytes()
    bad = tmp_path / "bad_magic.parquet"
    bad.write_bytes(b"XXXX" + data[4:])
    p = run("parquet", "dump", str(bad), ok=False)
    assert p.returncode == 1 and f"{bad}: bad magic" in p.stderr
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    p = run("parquet", "dump", str(cut), ok=False)
    assert p.returncode == 1 and "truncated" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# ---- (b) dlrec writes, pyarrow reads

def to_dlrec_json(table):
    fields, columns = [], {}
    for f in table.schema:
        fields.append({"name": f.name, "type": type_word(f.type), "nullable": f.nullable,
                       "list": pa.types.is_list(f.type)})
        vals = table.column(f.name).to_pylist()

        def enc(v):
            if isinstance(v, bytes):
                return v.hex()
            if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
                return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
            if isinstance(v, list):
                return [enc(x) for x in v]
            return v
        columns[f.name] = [enc(v) for v in vals]
    return {"fields": fields, "columns": columns}


def pyarrow_schema_of_dlrec(table):
    """The schema pyarrow gives a file dlrec wrote: the same, with list items named 'element'
    (the Parquet LIST layout's name) and nullable."""
    out = []
    for f in table.schema:
        t = f.type
        if pa.types.is_list(t):
            t = pa.list_(pa.field("element", t.value_type, nullable=True))
        out.append(pa.field(f.name, t, nullable=f.nullable))
    return pa.schema(out)


@pytest.mark.parametrize("codec", ["none", "snappy", "zstd"])
@pytest.mark.parametrize("dictionary", [True, False])
def test_dlrec_writes_pyarrow_reads(tmp_path, codec, dictionary):
    table = make_table(rows=700, seed=3)
    src = tmp_path / "in.json"
    src.write_text(json.dumps(to_dlrec_json(table)))
    path = tmp_path / "b.parquet"
    args = ["parquet", "write", "--from-json", str(src), "--out", str(path), "--codec", codec,
            "--row-group-rows", "250", "--page-rows", "60"]
    if dictionary:
        args.append("--dictionary")
    run(*args)
    f = pq.ParquetFile(path)
    md = f.metadata
    assert md.num_rows == 700 and md.num_row_groups == 3
    col = md.row_group(0).column(table.column_names.index("s"))
    assert col.compression == {"none": "UNCOMPRESSED", "snappy": "SNAPPY", "zstd": "ZSTD"}[codec]
    assert ("RLE_DICTIONARY" in col.encodings) == dictionary
    got = pq.read_table(path)
    want_schema = pyarrow_schema_of_dlrec(table)
    assert got.schema.remove_metadata() == want_schema, f"\n{got.schema}\n!=\n{want_schema}"
    # Values: identical, NaN == NaN.
    w, g = table.to_pylist(), got.to_pylist()
    assert len(w) == len(g)
    for i, (a, b) in enumerate(zip(w, g)):
        for k in a:
            assert same(a[k], b[k]), f"row {i} column {k}: wrote {a[k]!r}, pyarrow read {b[k]!r}"
    # And dlrec reads its own file back identically.
    check_dump(path, table)


# ---- (c) dlrec etl on Parquet input

# How pyarrow writes the ETL test's file: the codecs and encodings other writers pick too.
ETL_WRITES = {
    "zstd": dict(compression="zstd"),
    "brotli_delta_v2": dict(compression="brotli", use_dictionary=False, data_page_version="2.0",
                            column_encoding={"label": "DELTA_BINARY_PACKED",
                                             "i1": "DELTA_BINARY_PACKED",
                                             "c1": "DELTA_BYTE_ARRAY",
                                             "c2": "DELTA_LENGTH_BYTE_ARRAY",
                                             "tags.list.element": "DELTA_BYTE_ARRAY"}),
    "gzip_split": dict(compression="gzip", use_dictionary=False,
                       column_encoding={"f1": "BYTE_STREAM_SPLIT", "i1": "BYTE_STREAM_SPLIT"}),
    "lz4": dict(compression="lz4"),
}


@pytest.mark.parametrize("write", sorted(ETL_WRITES))
def test_etl_parquet_equals_csv(tmp_path, write):
    rnd = random.Random(11)
    n = 3000
    label = [int(rnd.random() < 0.3) for _ in range(n)]
    i1 = [None if rnd.random() < 0.2 else rnd.randrange(0, 500) for _ in range(n)]
    f1 = [None if rnd.random() < 0.1 else rnd.randrange(-40, 400) * 0.25 for _ in range(n)]
    c1 = [None if rnd.random() < 0.1 else f"u{rnd.randrange(0, 60)}" for _ in range(n)]
    c2 = [None if rnd.random() < 0.1 else f"v{int(rnd.paretovariate(1.2)) % 90}" for _ in range(n)]
    tags = [None if rnd.random() < 0.1 else [f"t{rnd.randrange(0, 30)}" for _ in range(rnd.randrange(1, 4))]
            for _ in range(n)]
    table = pa.table({"label": pa.array(label, pa.int64()), "i1": pa.array(i1, pa.int64()),
                      "f1": pa.array(f1, pa.float64()), "c1": pa.array(c1, pa.string()),
                      "c2": pa.array(c2, pa.string()), "tags": pa.array(tags, pa.list_(pa.string())),
                      "ignored": pa.array([1.0] * n)})
    pq_path = tmp_path / "in.parquet"
    pq.write_table(table, pq_path, row_group_size=700, **ETL_WRITES[write])
    csv_path = tmp_path / "in.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["label", "i1", "f1", "c1", "c2", "tags"])
        for r in range(n):
            w.writerow([label[r], "" if i1[r] is None else i1[r], "" if f1[r] is None else repr(f1[r]),
                        c1[r] or "", c2[r] or "", "|".join(tags[r]) if tags[r] else ""])
    schema = {"format": "csv", "columns": [
        {"name": "label", "kind": "label"}, {"name": "i1", "kind": "dense"},
        {"name": "f1", "kind": "dense"}, {"name": "c1", "kind": "categorical"},
        {"name": "c2", "kind": "categorical"},
        {"name": "tags", "kind": "categorical", "multi_hot": True}]}
    schema_path = tmp_path / "schema.json"
    schema_path.write_text(json.dumps(schema))
    # No Normalize: its fitted mean/std sum in chunk order, and text and Parquet input are cut
    # into different chunks (last-bit differences); every other op is exact.
    workflow = {"pipeline": [
        {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                      {"op": "LogOp"}]},
        {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]}]}
    wf_path = tmp_path / "wf.json"
    wf_path.write_text(json.dumps(workflow))
    outs = {}
    for name, inp in [("csv", csv_path), ("parquet", pq_path)]:
        out = tmp_path / f"out_{name}"
        p = run("etl", "--input", str(inp), "--schema", str(schema_path), "--workflow", str(wf_path),
                "--out", str(out), "--valid-ratio", "0.1", "--shard-rows", "1000")
        assert "train=2700 valid=300" in p.stdout, p.stdout
        outs[name] = out
    a, b = outs["csv"], outs["parquet"]
    ds_a = json.loads((a / "dataset.json").read_text())
    ds_b = json.loads((b / "dataset.json").read_text())
    assert ds_a == ds_b
    assert json.loads((a / "workflow.json").read_text()) == json.loads((b / "workflow.json").read_text())
    for shard in ds_a["train_shards"] + ds_a["valid_shards"]:
        assert filecmp.cmp(a / shard, b / shard, shallow=False), shard
    # A missing column is one clear error naming the file and the column; nothing is left.
    bad = dict(schema)
    bad["columns"] = schema["columns"] + [{"name": "nope", "kind": "dense"}]
    bad_path = tmp_path / "bad_schema.json"
    bad_path.write_text(json.dumps(bad))
    out = tmp_path / "out_bad"
    p = run("etl", "--input", str(pq_path), "--schema", str(bad_path), "--out", str(out), ok=False)
    assert p.returncode == 1
    assert f"{pq_path}: the schema's dense column 'nope' is not in the file" in p.stderr
    assert not (out / "dataset.json").exists()


@pytest.mark.parametrize("source", ["datagen", "criteo_sample"])
def test_etl_criteo_parquet_equals_tsv(tmp_path, source):
    """Criteo-layout rows as TSV and as Parquet (categories as hex strings, read with the criteo
    schema's hex encoding): `dlrec etl` with the default Criteo workflow writes identical files."""
    pacsv = pytest.importorskip("pyarrow.csv")
    if source == "datagen":
        tsv = tmp_path / "gen.tsv"
        run("datagen", "--out", str(tsv), "--rows", "20000", "--seed", "3")
    else:
        src_dir = os.environ.get("DLREC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
        tsv = os.path.join(src_dir, "..", "shared", "data", "criteo", "day_0.part.tsv")
        if not os.path.exists(tsv):
            pytest.skip("no Criteo sample (../shared/data/criteo/day_0.part.tsv)")
    names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    types = {"label": pa.int64(), **{f"I{i}": pa.int64() for i in range(1, 14)},
             **{f"C{i}": pa.string() for i in range(1, 27)}}
    table = pacsv.read_csv(tsv, read_options=pacsv.ReadOptions(column_names=names),
                           parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
                           convert_options=pacsv.ConvertOptions(column_types=types))
    parquet = tmp_path / "in.parquet"
    pq.write_table(table, parquet, row_group_size=3000, compression="snappy")
    schema = tmp_path / "criteo.json"
    schema.write_text(json.dumps({"format": "criteo"}))
    outs = []
    for inp in (tsv, parquet):
        out = tmp_path / f"out_{len(outs)}"
        run("etl", "--input", str(inp), "--schema", str(schema), "--out", str(out),
            "--valid-ratio", "0.1")
        outs.append(out)
    files = sorted(os.listdir(outs[0]))
    assert files == sorted(os.listdir(outs[1]))
    for f in files:
        assert filecmp.cmp(outs[0] / f, outs[1] / f, shallow=False), f
