// Sharded checkpoints of a ShardedEmbedding: one tensor file per rank plus a manifest, loadable
// into any number of ranks and any plan (docs/DISTRIBUTED.md, "Sharded checkpoints").
#include <cstdio>
#include <filesystem>
#include <map>

#include "dist/sharded_embedding_layout.h"
#include "dlrec/core/file_util.h"
#include "dlrec/dist/sharded_embedding.h"
#include "dlrec/io/tensor_file.h"

namespace dlrec::dist {

namespace {

constexpr const char* kManifest = "embedding.manifest.json";
constexpr const char* kFormat = "dlrec-sharded-embedding";
constexpr int kVersion = 1;

std::string rank_file(int64_t step, int rank, int ranks) {
  return "embedding.step-" + std::to_string(step) + ".rank-" + std::to_string(rank) + "-of-" +
         std::to_string(ranks) + ".dlrec";
}

// A piece's tensors are "<tensor>.weight" (+ the state suffix); the tensor is the table's name,
// or "<table>.frequent" for a hybrid table's replicated prefix (rank 0's file holds both).
// "row_begin" (the Piece's row_base) and "tensor" are written only when they differ from 0 and
// the table's name, so that other checkpoints read as before.
json piece_json(const std::string& table, const std::string& tensor, const detail::Piece& p) {
  json j = {{"table", table},       {"row_wise", p.row_wise}, {"rank", p.rank}, {"ranks", p.ranks},
            {"rows", p.local_rows}, {"col_begin", p.c0},      {"col_end", p.c1}};
  if (p.row_base != 0) j["row_begin"] = p.row_base;
  if (tensor != table) j["tensor"] = tensor;
  return j;
}

// A piece of the manifest, checked against the table it belongs to so that placing it stays
// inside the table.
struct ManifestPiece {
  int table = -1;
  std::string tensor;
  detail::Piece piece;
};

}  // namespace

void ShardedEmbedding::save(const std::string& dir, int64_t step) {
  DLREC_CHECK(step >= 0, "ShardedEmbedding::save: negative step ", step);
  const int n = comm_.size(), me = comm_.rank();
  if (me == 0) make_dirs(dir);
  comm_.barrier();  // the directory exists for every rank
  std::vector<io::NamedTensor> tensors;
  json pieces = json::array();
  auto add = [&](int t, const nn::Param& p, const detail::Piece& piece, const std::string& tensor) {
    const ShardedTableConfig& c = tables_[t];
    tensors.emplace_back(tensor + ".weight", p.value);
    if (c.optimizer->has_state())
      tensors.emplace_back(tensor + ".weight" + c.optimizer->state_suffix(), p.state);
    pieces.push_back(piece_json(c.spec.name, tensor, piece));
  };
  for (int t = 0; t < num_tables(); ++t) {
    if (plan_.tables[t].kind == ShardingKind::Replicated) {
      if (me == 0)
        add(t, replicated_param(t),
            detail::Piece{false, 0, 1, tables_[t].spec.rows, 0, tables_[t].spec.dim},
            tables_[t].spec.name);
      continue;
    }
    const nn::Param* f = frequent_param(t);
    if (f && me == 0)
      add(t, *f, detail::frequent_piece(frequent_rows(t), tables_[t].spec.dim),
          tables_[t].spec.name + ".frequent");
    const nn::Param* p = owned_param(t);
    if (p) add(t, *p, detail::piece_of(plan_, tables_, t, me), tables_[t].spec.name);
  }
  const std::string name = rank_file(step, me, n);
  io::save_tensors(
      dir + "/" + name, tensors,
      {{"format", kFormat}, {"version", kVersion}, {"rank", me}, {"ranks", n}, {"step", step}});
  // Rank 0 collects every rank's piece list for the manifest.
  const std::string mine = pieces.dump();
  const std::vector<int64_t> counts = comm_.all_gather_counts(static_cast<int64_t>(mine.size()));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::string all(static_cast<size_t>(total), '\0');
  comm_.all_gather_v(mine.data(), all.data(), counts, Elem::U8);
  if (me == 0) {
    json files = json::array();
    for (int r = 0, at = 0; r < n; at += static_cast<int>(counts[r]), ++r)
      files.push_back({{"rank", r},
                       {"file", rank_file(step, r, n)},
                       {"pieces", parse_json(all.substr(at, counts[r]), "rank pieces")}});
    json tables = json::array();
    for (const ShardedTableConfig& c : tables_)
      tables.push_back({{"name", c.spec.name},
                        {"rows", c.spec.rows},
                        {"dim", c.spec.dim},
                        {"optimizer", nn::optimizer_name(c.optimizer->kind())},
                        {"state_suffix", c.optimizer->state_suffix()}});
    json manifest = {
        {"format", kFormat}, {"version", kVersion}, {"step", step},           {"ranks", n},
        {"tables", tables},  {"files", files},      {"plan", plan_.to_json()}};
    // The files of the checkpoint this one replaces go once the new manifest is in place.
    std::vector<std::string> old_files;
    const std::string path = dir + "/" + kManifest;
    if (file_exists(path)) {
      try {
        const json old = read_json_file(path);  // kept alive: the loop reads into it
        for (const json& f : old.at("files")) old_files.push_back(f.at("file").get<std::string>());
      } catch (const std::exception&) {
        // An unreadable old manifest: nothing of it is removed.
      }
    }
    write_file_atomic(path, manifest.dump(1) + "\n");
    for (const std::string& f : old_files) {
      bool current = false;
      for (const json& nf : files) current |= nf["file"] == f;
      if (!current && f.find('/') == std::string::npos) std::remove((dir + "/" + f).c_str());
    }
  }
  comm_.barrier();  // the checkpoint is complete when save returns on any rank
}

int64_t ShardedEmbedding::load(const std::string& dir) {
  const std::string path = dir + "/" + kManifest;
  if (!file_exists(path))
    fail("checkpoint '", dir, "': no ", kManifest, " (not a sharded checkpoint, or its save did ",
         "not finish)");
  const json m = read_json_file(path);
  ConfigReader r(m, "");
  const std::string what = "checkpoint manifest '" + path + "'";
  if (r.get<std::string>("format", "") != kFormat || r.get<int>("version", 0) != kVersion)
    fail(what, ": not a ", kFormat, " manifest of version ", kVersion);
  const int64_t step = r.get_int_range("step", 0, 0, int64_t{1} << 62);
  const int ranks = static_cast<int>(r.get_int_range("ranks", 1, 1, 65536));
  r.raw("plan");
  // The tables: the same names, rows, dims and optimizer state as this model's.
  const json& tables = r.raw("tables");
  DLREC_CHECK(tables.is_array(), what, ": 'tables' must be an array");
  std::map<std::string, int> index;
  for (int t = 0; t < num_tables(); ++t) index[tables_[t].spec.name] = t;
  DLREC_CHECK(static_cast<int>(tables.size()) == num_tables(), what, " has ", tables.size(),
              " tables, the model ", num_tables());
  for (size_t i = 0; i < tables.size(); ++i) {
    ConfigReader tr(tables[i], "tables[" + std::to_string(i) + "]");
    const std::string name = tr.require<std::string>("name");
    auto it = index.find(name);
    DLREC_CHECK(it != index.end(), what, " has table '", name, "', which the model has not");
    const ShardedTableConfig& c = tables_[it->second];
    const int64_t rows = tr.require<int64_t>("rows"), dim = tr.require<int64_t>("dim");
    DLREC_CHECK(rows == c.spec.rows && dim == c.spec.dim, what, ": table '", name, "' is ", rows,
                " x ", dim, ", the model's ", c.spec.rows, " x ", c.spec.dim);
    const std::string suffix = tr.get<std::string>("state_suffix", "");
    const std::string trained_with = tr.get<std::string>("optimizer", "?");
    DLREC_CHECK(suffix == c.optimizer->state_suffix(), what, ": table '", name,
                "' was trained with optimizer ", trained_with, ", the model uses ",
                nn::optimizer_name(c.optimizer->kind()), " (optimizer state '", suffix, "' vs '",
                c.optimizer->state_suffix(), "')");
    tr.finish();
  }
  // The pieces, rank file by rank file; each checked to lie inside its table.
  const json& files = r.raw("files");
  r.finish();
  DLREC_CHECK(files.is_array() && static_cast<int>(files.size()) == ranks, what, " lists ",
              files.is_array() ? files.size() : 0, " rank files for ", ranks, " ranks");
  std::vector<std::string> file_names(ranks);
  std::vector<std::vector<ManifestPiece>> pieces(ranks);
  std::vector<int64_t> covered(num_tables(), 0);
  for (int f = 0; f < ranks; ++f) {
    ConfigReader fr(files[f], "files[" + std::to_string(f) + "]");
    DLREC_CHECK(fr.require<int>("rank") == f, what, ": files[", f, "] is not rank ", f, "'s");
    file_names[f] = fr.require<std::string>("file");
    DLREC_CHECK(file_names[f].find('/') == std::string::npos && !file_names[f].empty(), what,
                ": bad file name '", file_names[f], "'");
    for (const json& pj : fr.raw("pieces")) {
      ConfigReader pr(pj, "files[" + std::to_string(f) + "].pieces");
      ManifestPiece mp;
      const std::string name = pr.require<std::string>("table");
      DLREC_CHECK(index.count(name), what, ": a piece of unknown table '", name, "'");
      mp.table = index[name];
      const TableSpec& s = tables_[mp.table].spec;
      detail::Piece& p = mp.piece;
      p.row_wise = pr.require<bool>("row_wise");
      p.ranks = static_cast<int>(pr.get_int_range("ranks", 1, 1, 65536));
      p.rank = static_cast<int>(pr.get_int_range("rank", 0, 0, p.ranks - 1));
      p.local_rows = pr.get_int_range("rows", 0, 0, s.rows);
      p.c0 = pr.get_int_range("col_begin", 0, 0, s.dim - 1);
      p.c1 = pr.get_int_range("col_end", s.dim, p.c0 + 1, s.dim);
      p.row_base = pr.get_int_range("row_begin", 0, 0, s.rows);
      mp.tensor = pr.get<std::string>("tensor", name);
      DLREC_CHECK(mp.tensor == name || mp.tensor == name + ".frequent", what,
                  ": a piece of table '", name, "' names tensor '", mp.tensor, "'");
      pr.finish();
      // Row-wise: the split of rows [row_begin, rows); else rows [row_begin, row_begin + rows),
      // the whole table or (a hybrid table's prefix) its first rows.
      const int64_t want_rows = p.row_wise
                                    ? detail::row_wise_rows(s.rows - p.row_base, p.rank, p.ranks)
                                    : (mp.tensor == name ? s.rows - p.row_base : p.local_rows);
      DLREC_CHECK(p.local_rows == want_rows && p.row_base + p.local_rows <= s.rows, what,
                  ": a piece of table '", name, "' has ", p.local_rows, " rows from row ",
                  p.row_base, ", expected ", want_rows);
      covered[mp.table] += p.local_rows * (p.c1 - p.c0);
      pieces[f].push_back(mp);
    }
    fr.finish();
  }
  for (int t = 0; t < num_tables(); ++t)
    DLREC_CHECK(covered[t] == tables_[t].spec.rows * tables_[t].spec.dim, what,
                ": the pieces of table '", tables_[t].spec.name, "' cover ", covered[t], " of its ",
                tables_[t].spec.rows * tables_[t].spec.dim, " values");

  for (int f = 0; f < ranks; ++f)
    if (!file_exists(dir + "/" + file_names[f]))
      fail("checkpoint '", dir, "': the file of rank ", f, " ('", file_names[f],
           "') is missing; the manifest lists ", ranks, " rank files");

  // Whole tables of the ones this rank holds a part of, filled from the files that have them.
  const int me = comm_.rank();
  std::vector<char> needed(num_tables(), 0);
  for (int t = 0; t < num_tables(); ++t)
    needed[t] =
        plan_.tables[t].kind == ShardingKind::Replicated || plan_.shard_of(t, me) != nullptr;
  std::vector<Tensor> values(num_tables()), states(num_tables());
  for (int t = 0; t < num_tables(); ++t) {
    if (!needed[t]) continue;
    const ShardedTableConfig& c = tables_[t];
    values[t] = Tensor::zeros({c.spec.rows, c.spec.dim}, DType::F32);
    if (c.optimizer->has_state())
      states[t] =
          Tensor::zeros(detail::state_shape(*c.optimizer, c.spec.rows, c.spec.dim), DType::F32);
  }
  for (int f = 0; f < ranks; ++f) {
    std::vector<io::NamedTensor> targets;
    std::vector<std::pair<const ManifestPiece*, bool>> order;  // (piece, is state)
    for (const ManifestPiece& mp : pieces[f]) {
      if (!needed[mp.table]) continue;
      const ShardedTableConfig& c = tables_[mp.table];
      const int64_t cols = mp.piece.c1 - mp.piece.c0;
      targets.emplace_back(mp.tensor + ".weight",
                           Tensor::empty({mp.piece.local_rows, cols}, DType::F32));
      order.push_back({&mp, false});
      if (c.optimizer->has_state()) {
        targets.emplace_back(
            mp.tensor + ".weight" + c.optimizer->state_suffix(),
            Tensor::empty(detail::state_shape(*c.optimizer, mp.piece.local_rows, cols),
                          DType::F32));
        order.push_back({&mp, true});
      }
    }
    if (targets.empty()) continue;
    const std::string file = dir + "/" + file_names[f];
    const json meta = io::load_tensors(file, targets, {/*allow_extra=*/true, false});
    DLREC_CHECK(meta.value("step", int64_t{-1}) == step, "checkpoint '", dir, "': '", file_names[f],
                "' is of step ", meta.value("step", int64_t{-1}), ", the manifest of step ", step);
    for (size_t i = 0; i < targets.size(); ++i) {
      const ManifestPiece& mp = *order[i].first;
      const bool state = order[i].second;
      const detail::StateLayout sl(*tables_[mp.table].optimizer);
      detail::place_piece((state ? states : values)[mp.table].data<float>(),
                          targets[i].second.data<float>(), mp.piece, tables_[mp.table].spec.dim,
                          state, sl);
    }
  }
  for (int t = 0; t < num_tables(); ++t)
    if (needed[t]) load_table(t, values[t], states[t]);
  return step;
}

}  // namespace dlrec::dist
