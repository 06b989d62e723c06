// Writes the seed corpora of the fuzz targets (fuzz/, docs/FUZZING.md): small valid inputs
// made with the library itself (datagen, the Parquet writer with each codec, ETL, the shard
// writer, checkpoints and weights, KServe requests), each with the selector bytes its target
// reads first. Nothing is committed: CI and the campaign script run this first.
//
//   make_fuzz_seeds OUT_DIR              creates OUT_DIR/<target>/<seed> for every target
//   make_fuzz_seeds --findings OUT_DIR   creates OUT_DIR/<target>/<name>: reproducers of the
//                                        open findings (docs/FUZZING.md, "Findings"); each
//                                        must run clean once its bug is fixed:
//                                        `fuzz_shard OUT_DIR/shard/*`
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/parquet.h"
#include "dlrec/io/shard.h"
#include "dlrec/train/trainer.h"
#include "tensor_file_api.h"
#include "tiny_model.h"
#ifdef DLREC_FUZZ_SERVE
#include "grpc_service.pb.h"
#endif

namespace {

using namespace dlrec;
namespace fs = std::filesystem;

std::string g_out;
int g_count = 0;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = g_out + "/" + target;
  fs::create_directories(dir);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  ++g_count;
}

std::string sel(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s += static_cast<char>(b);
  return s;
}

io::DatagenConfig gen(int64_t rows, int nd, int nc, int multi) {
  io::DatagenConfig g;
  g.rows = rows;
  g.seed = 11;
  g.num_dense = nd;
  g.num_cat = nc;
  g.num_multi_hot = multi;
  g.cardinalities = {20, 300, 5000};
  return g;
}

std::string datagen_text(const io::DatagenConfig& g) {
  std::ostringstream s;
  io::generate(g, s);
  return s.str();
}

void text_seeds() {
  const std::string criteo = datagen_text(gen(40, 13, 26, 0));
  const std::string small = datagen_text(gen(300, 2, 3, 0));
  // Schema 0 (Criteo 13/26): mapped, piped, skip mode with 7-row chunks, page-padded.
  seed("text_reader", "criteo_map", sel({0x00, 0}) + criteo);
  seed("text_reader", "criteo_pipe_small_blocks", sel({0x48, 0}) + criteo);
  seed("text_reader", "criteo_skip_chunk7", sel({0x14, 0}) + criteo);
  seed("text_reader", "criteo_padded", sel({0x00, '\n'}) + criteo.substr(0, criteo.size() - 1));
  seed("text_reader", "criteo_bad_rows",
       sel({0x04, 0}) + "1\t2\n0\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13" +
           std::string(26, '\t') + "\nx\t" + std::string(38, '\t') + "\n");
  seed("text_reader", "small_chunk1", sel({0x11, 0}) + small);
  seed("text_reader", "small_max_rows", sel({0x81, 0}) + small);
  seed("text_reader", "small_pipe", sel({0x09, 0}) + small);
  // Schema 2 (CSV, header, string categories, '|' lists).
  const std::string csv =
      "note,tags,user,price,label\r\nx,a|b|c,alice,2.5,1\r\ny,,bob,,0\r\n\"q\",d,carol,-1e3,1\n"
      "z,e|e|e|e,dave,0x10,0\nw,f,,inf,1";
  seed("text_reader", "csv_map", sel({0x02, 0}) + csv);
  seed("text_reader", "csv_pipe_skip", sel({0x4E, 0}) + csv);
  // Schema 3 (TSV, hex, multi-hot ',' lists, a skipped column).
  const std::string tsv =
      "1\t3\tjunk\tdeadbeef\t1,2,ff\n0\t\t\t0\t\n1\t-4\tz\tFFFFFFFFFFFFFFFF\tabc,,def\n";
  seed("text_reader", "tsv_multi", sel({0x03, 0}) + tsv);
  seed("text_reader", "tsv_multi_pipe", sel({0x0B, 0}) + tsv);
}

void parquet_seeds(const std::string& tmp) {
  using io::ParquetField;
  using io::ParquetType;
  std::vector<ParquetField> fields = {
      {"label", ParquetType::Int32, false}, {"I1", ParquetType::Double, true},
      {"I2", ParquetType::Float, true},     {"C1", ParquetType::ByteArray, true},
      {"C2", ParquetType::Int64, true, true}, {"B", ParquetType::Boolean, true},
      {"C3", ParquetType::Int32, true}};
  const int64_t rows = 37;
  std::vector<io::ParquetColumnData> cols(fields.size());
  for (auto& c : cols) c.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    cols[0].ints.push_back(r % 3 == 0);
    cols[1].reals.push_back(r * 1.25);
    cols[1].valid.push_back(r % 5 != 0);
    cols[2].reals.push_back(-r * 0.5);
    cols[3].strings.push_back(r % 4 ? "cat" + std::to_string(r % 6) : "");
    cols[3].valid.push_back(r % 4 != 0);
    cols[5].ints.push_back(r % 2);
    cols[6].ints.push_back(static_cast<int64_t>(r * 7919 % 97));
  }
  auto& list = cols[4];  // lists of 0..3 ids, some null lists, some null elements
  list.offsets.push_back(0);
  for (int64_t r = 0; r < rows; ++r) {
    list.row_valid.push_back(r % 7 != 3);
    for (int64_t k = 0; r % 7 != 3 && k < r % 4; ++k) {
      list.ints.push_back(r * 10 + k);
      list.valid.push_back(k != 2);
    }
    list.offsets.push_back(static_cast<int64_t>(list.ints.size()));
  }
  struct Variant {
    const char* name;
    io::ParquetCodec codec;
    bool dictionary;
    int64_t group_rows, page_rows;
  };
  const Variant variants[] = {
      {"plain_uncompressed", io::ParquetCodec::Uncompressed, false, 1 << 20, 1 << 16},
      {"dict_uncompressed", io::ParquetCodec::Uncompressed, true, 1 << 20, 1 << 16},
      {"dict_snappy_pages", io::ParquetCodec::Snappy, true, 1 << 20, 8},
      {"plain_snappy_groups", io::ParquetCodec::Snappy, false, 16, 1 << 16},
      {"dict_zstd_groups_pages", io::ParquetCodec::Zstd, true, 20, 6},
      {"plain_zstd", io::ParquetCodec::Zstd, false, 1 << 20, 1 << 16},
  };
  int i = 0;
  for (const Variant& v : variants) {
    io::ParquetWriteOptions o;
    o.codec = v.codec;
    o.dictionary = v.dictionary;
    o.row_group_rows = v.group_rows;
    o.page_rows = v.page_rows;
    const std::string path = tmp + "/seed.parquet";
    io::write_parquet(path, fields, cols, o);
    const std::string bytes = slurp(path);
    seed("parquet", v.name, sel({i++ % 16}) + bytes);
    fs::remove(path);
  }
}

void shard_seeds(const std::string& tmp) {
  io::ShardLayout layout;
  layout.num_dense = 2;
  layout.cardinalities = {5, 300, 70000, 3};
  layout.multi_hot = {false, true, false, true};
  io::Batch b;
  const int64_t rows = 50;
  b.reset(layout.num_dense, 4);
  b.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    b.labels.push_back(r % 2);
    b.dense.push_back(r * 0.5f);
    b.dense.push_back(-1.f);
    for (int t = 0; t < 4; ++t) {
      const int64_t n = layout.multi_hot[t] ? r % 3 : 1;
      for (int64_t k = 0; k < n; ++k)
        b.cat_indices[t].push_back((r * 31 + k) % layout.cardinalities[t]);
      b.cat_offsets[t].push_back(static_cast<int64_t>(b.cat_indices[t].size()));
    }
  }
  const std::string path = tmp + "/seed.shard";
  struct Variant {
    const char* name;
    int64_t block_rows;
    int selector;
  };
  for (const Variant& v : {Variant{"blocks16_fixcrc", 16, 0x01}, Variant{"blocks16", 16, 0x06},
                           Variant{"oneblock_fixcrc_step3", 1 << 16, 0x03}}) {
    io::ShardWriter w(path, layout, v.block_rows);
    w.write(b);
    w.close();
    seed("shard", v.name, sel({v.selector}) + slurp(path));
  }
  io::ShardLayout one_hot;
  one_hot.num_dense = 0;
  one_hot.cardinalities = {1000};
  one_hot.multi_hot = {false};
  io::ShardWriter empty(path, one_hot);
  empty.close();
  seed("shard", "empty_fixcrc", sel({0x01}) + slurp(path));
  fs::remove(path);
}

void tensor_file_seeds(const std::string& tmp) {
  auto model = fuzz::tiny_model();
  const std::string path = tmp + "/seed.dlrec";
  train::CheckpointState st;
  st.step = 12;
  st.position = 3456;
  train::save_checkpoint(path, *model, fuzz::tiny_config(), fuzz::tiny_layout(), st);
  const std::string ckpt = slurp(path);
  seed("tensor_file", "checkpoint", sel({0}) + ckpt);
  seed("tensor_file", "checkpoint_fixcrc", sel({1}) + ckpt);
  seed("json", "checkpoint_meta.json", fuzz::read_tensor_meta(path).dump(1));
  fuzz::save_tensors(path, model->parameters(), {{"kind", "weights"}});
  seed("tensor_file", "weights_fixcrc", sel({1}) + slurp(path));
  fs::remove(path);
}

// JSON: the configs in the tree, and the files an ETL run, a checkpoint and an export write.
void json_seeds(const std::string& tmp) {
  for (const auto& e : fs::directory_iterator(std::string(DLREC_SOURCE_DIR) + "/configs"))
    if (e.path().extension() == ".json")
      seed("json", "config_" + e.path().filename().string(), slurp(e.path().string()));
  const std::string logs = tmp + "/logs.tsv";
  io::DatagenConfig g = gen(400, 3, 4, 1);
  io::generate_file(g, logs);
  etl::EtlOptions o;
  o.inputs = {logs};
  o.schema = g.schema();
  o.workflow = json::parse(R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}, {"op": "Normalize"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]}]})");
  o.output_dir = tmp + "/data";
  o.valid_ratio = 0.25;
  etl::run_etl(o);
  for (const char* f : {"workflow.json", "dataset.json", "stats.json"})
    seed("json", std::string("etl_") + f, slurp(o.output_dir + "/" + f));
  seed("json", "schema_criteo.json", io::Schema::criteo().to_json().dump(1));
  seed("json", "datagen.json", g.to_json().dump(1));
  // model.json as export_model writes it.
  const model::RunConfig cfg = fuzz::tiny_config();
  seed("json", "model.json",
       json{{"format", "dlrec-model"}, {"version", 1}, {"config", cfg.to_json()},
            {"layout", fuzz::tiny_layout().to_json()}, {"step", 3}}
           .dump(2));
  seed("json", "run.json", json{{"config", cfg.to_json()}, {"data_dir", "/data"}}.dump(2));
  seed("json", "serve_config.json", R"({"version_policy": {"specific": {"versions": [1, 3]}},
    "max_batch_size": 4096, "dynamic_batching": {"preferred_batch_size": [256, 1024],
    "max_queue_delay_microseconds": 200, "max_queue_size": 64},
    "instance_group": [{"kind": "KIND_CPU", "count": 2}]})");
  fs::remove_all(o.output_dir);
  fs::remove(logs);
}

#ifdef DLREC_FUZZ_SERVE
void http_seeds() {
  const std::string json_body = R"({"id": "r1", "inputs": [
    {"name": "I1", "datatype": "FP32", "shape": [2], "data": [1.5, -2]},
    {"name": "C1", "datatype": "BYTES", "shape": [2, 1], "data": [["a1b2"], ["ffff"]]},
    {"name": "C2", "datatype": "INT64", "shape": [2], "data": [7, -9]},
    {"name": "B", "datatype": "BOOL", "shape": [1, 2], "data": [true, false]},
    {"name": "U", "datatype": "UINT16", "shape": [1], "data": [65535]}],
    "outputs": [{"name": "probability", "parameters": {"binary_data": false}}]})";
  seed("http_codec", "json_data", sel({0}) + json_body);
  // Binary tensors after the JSON part ("}\n" ends it: the target's header length).
  std::string bin =
      R"({"inputs": [{"name": "dense", "datatype": "FP32", "shape": [2, 2], )"
      R"("parameters": {"binary_data_size": 16}}, {"name": "cat", "datatype": "BYTES", )"
      R"("shape": [2], "parameters": {"binary_data_size": 13}}], )"
      R"("parameters": {"binary_data_output": true}})"
      "\n";
  const float dense[4] = {1.f, 2.5f, -3.f, 0.f};
  bin.append(reinterpret_cast<const char*>(dense), sizeof dense);
  const char bytes_el[13] = {1, 0, 0, 0, 'x', 4, 0, 0, 0, 'a', 'b', 'c', 'd'};
  bin.append(bytes_el, sizeof bytes_el);
  seed("http_codec", "binary", sel({1}) + bin);
}

void wire_seeds() {
  inference::ModelInferRequest q;
  q.set_model_name("m");
  q.set_model_version("1");
  q.set_id("req-1");
  auto* d = q.add_inputs();
  d->set_name("dense");
  d->set_datatype("FP32");
  d->add_shape(3);
  d->add_shape(2);
  const float dense[6] = {1, 2, 3, 4, 5, 6};
  q.add_raw_input_contents(std::string(reinterpret_cast<const char*>(dense), sizeof dense));
  auto* c = q.add_inputs();
  c->set_name("cat");
  c->set_datatype("BYTES");
  c->add_shape(3);
  q.add_raw_input_contents(std::string("\x01\0\0\0a\x02\0\0\0bc\0\0\0\0", 15));
  q.add_outputs()->set_name("probability");
  const std::string raw = q.SerializeAsString();
  seed("infer_wire", "raw_one_segment", sel({0}) + raw);
  seed("infer_wire", "raw_three_cuts", sel({3, 9, 0, 40, 0, 70, 0}) + raw);
  seed("infer_wire", "raw_cuts_gather", sel({0x0A, 50, 0, 60, 0}) + raw);
  // Typed contents and parameters: what the wire reader leaves to protobuf.
  inference::ModelInferRequest t;
  t.set_model_name("m");
  auto* in = t.add_inputs();
  in->set_name("I1");
  in->set_datatype("INT64");
  in->add_shape(2);
  in->mutable_contents()->add_int64_contents(5);
  in->mutable_contents()->add_int64_contents(-1);
  (*t.mutable_parameters())["priority"].set_int64_param(1);
  seed("infer_wire", "typed_contents", sel({1, 5, 0}) + t.SerializeAsString());
}
#endif

template <class T>
void append_le(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Reproducers of open findings (not seeds: they fail until fixed).
void finding_inputs() {
  // Shard block whose row count times 4 wraps around 2^64: load_block's size check passes
  // (24-byte block, no payload) and decode() reads the labels past the block
  // (UBSan: signed overflow in decode's n * 4; then a heap read out of bounds).
  const std::string hdr =
      R"({"layout": {"num_dense": 0, "cardinalities": [70000], "multi_hot": [false]}})";
  std::string f = "DLRSHARD";
  append_le<uint32_t>(f, 2);
  append_le<uint32_t>(f, static_cast<uint32_t>(hdr.size()));
  f += hdr;
  append_le<uint32_t>(f, 0);  // the target's selector bit 0 rewrites every checksum
  const uint64_t header_end = f.size(), rows = uint64_t{1} << 62;
  append_le<uint64_t>(f, rows);
  append_le<uint64_t>(f, 0);
  append_le<uint32_t>(f, 0);
  append_le<uint32_t>(f, 0);
  const uint64_t footer = f.size();
  for (uint64_t v : {uint64_t{1}, rows, uint64_t{0}, header_end}) append_le<uint64_t>(f, v);
  append_le<uint64_t>(f, footer);
  append_le<uint32_t>(f, 0);
  append_le<uint32_t>(f, 0);
  f.append("DLRSEND\0", 8);
  seed("shard", "block_rows_overflow", sel({0x01}) + f);
}

}  // namespace

int main(int argc, char** argv) {
  const bool findings = argc == 3 && std::string(argv[1]) == "--findings";
  const char* usage = "usage: %s [--findings] OUT_DIR\n";
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf(usage, argv[0]);
    return 0;
  }
  // An option where OUT_DIR belongs is a mistake, not a folder to create.
  if ((argc != 2 && !findings) || argv[argc - 1][0] == '-') {
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  try {
    g_out = argv[argc - 1];
    if (findings) {
      fs::create_directories(g_out);
      finding_inputs();
      std::printf("make_fuzz_seeds: %d finding reproducers in %s\n", g_count, g_out.c_str());
      return 0;
    }
    fs::create_directories(g_out);
    const std::string tmp = g_out + "/.work." + std::to_string(::getpid());
    fs::create_directories(tmp);
    text_seeds();
    parquet_seeds(tmp);
    shard_seeds(tmp);
    tensor_file_seeds(tmp);
    json_seeds(tmp);
#ifdef DLREC_FUZZ_SERVE
    http_seeds();
    wire_seeds();
#endif
    fs::remove_all(tmp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  std::printf("make_fuzz_seeds: %d seeds in %s\n", g_count, g_out.c_str());
  return 0;
}
