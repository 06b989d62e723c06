// HashedEmbedding's export and import as a tensor file; everything else is inline in
// include/dlrec/embedding/hashed_embedding_impl.h.
#include "dlrec/embedding/hashed_embedding.h"

#include <cstring>
#include <mutex>

#include "dlrec/io/tensor_file.h"

namespace dlrec::embedding {

void HashedEmbedding::save(const std::string& path) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t n = size_, d = dim_;
  Tensor keys = Tensor::empty({n}, DType::I64);
  Tensor w = Tensor::empty({n, d}, DType::F32);
  Tensor st = srow_ ? Tensor::empty({n, srow_}, DType::F32) : Tensor();
  int64_t* kp = keys.data<int64_t>();
  float* wp = w.data<float>();
  int64_t i = 0;
  for (int32_t s = head_; s >= 0; s = next_[s], ++i) {
    kp[i] = keys_[s];
    std::memcpy(wp + i * d, w_ + static_cast<int64_t>(s) * d, d * sizeof(float));
    if (srow_)
      std::memcpy(st.data<float>() + i * srow_, st_ + static_cast<int64_t>(s) * srow_,
                  srow_ * sizeof(float));
  }
  DLREC_CHECK(i == n, "HashedEmbedding::save: LRU list out of step with the size (bug)");
  std::vector<io::NamedTensor> tensors = {{"keys", keys}, {"weights", w}};
  if (srow_) tensors.emplace_back("state", st);
  const json meta = {{"kind", "hashed_embedding"},
                     {"rows", n},
                     {"dim", d},
                     {"capacity", cap_},
                     {"seed", o_.seed},
                     {"init_scale", o_.init_scale},
                     {"optimizer", nn::optimizer_name(opt_.kind())},
                     {"state_row_size", srow_},
                     {"lookups", lookups_.load()},
                     {"hits", hits_.load()},
                     {"inserts", inserts_.load()},
                     {"evictions", evictions_.load()}};
  io::save_tensors(path, tensors, meta);
}

void HashedEmbedding::load(const std::string& path) {
  const json meta = io::read_tensor_meta(path);
  int64_t n = 0;
  try {
    DLREC_CHECK(meta.value("kind", "") == "hashed_embedding", "'", path,
                "' is not a hashed embedding table");
    n = meta.at("rows").get<int64_t>();
    const int64_t d = meta.at("dim").get<int64_t>();
    const int64_t srow = meta.at("state_row_size").get<int64_t>();
    DLREC_CHECK(d == dim_, "'", path, "' holds rows of dim ", d, ", the table has dim ", dim_);
    DLREC_CHECK(srow == srow_, "'", path, "' holds ", srow, " optimizer state values per row (",
                meta.value("optimizer", "?"), "), the table's optimizer (",
                nn::optimizer_name(opt_.kind()), ") keeps ", srow_);
    DLREC_CHECK(n >= 0 && n <= cap_, "'", path, "' holds ", n,
                " rows, more than the table's capacity of ", cap_);
  } catch (const json::exception& e) {
    fail("'", path, "': bad hashed embedding meta: ", e.what());
  }
  Tensor keys = Tensor::empty({n}, DType::I64);
  Tensor w = Tensor::empty({n, dim_}, DType::F32);
  Tensor st = srow_ ? Tensor::empty({n, srow_}, DType::F32) : Tensor();
  std::vector<io::NamedTensor> tensors = {{"keys", keys}, {"weights", w}};
  if (srow_) tensors.emplace_back("state", st);
  io::load_tensors(path, tensors);

  std::unique_lock<std::shared_mutex> lock(mu_);
  std::fill(index_.begin(), index_.end(), 0);
  head_ = tail_ = -1;
  size_ = 0;
  const int64_t* kp = keys.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = kp[i];
    const uint64_t h = key_hash(key);
    if (index_find(key, h) != hashed_detail::kNone) fail("'", path, "': key ", key, " appears twice");
    const int32_t s = static_cast<int32_t>(size_++);
    keys_[s] = key;
    uint64_t pos = h & mask_;
    while (index_[pos] != 0) pos = (pos + 1) & mask_;
    index_[pos] = hashed_detail::make_entry(h, s);
    lru_push_back(s);
    std::memcpy(w_ + static_cast<int64_t>(s) * dim_, w.data<float>() + i * dim_,
                dim_ * sizeof(float));
    if (srow_)
      std::memcpy(st_ + static_cast<int64_t>(s) * srow_, st.data<float>() + i * srow_,
                  srow_ * sizeof(float));
  }
  lookups_ = meta.value("lookups", int64_t{0});
  hits_ = meta.value("hits", int64_t{0});
  inserts_ = meta.value("inserts", int64_t{0});
  evictions_ = meta.value("evictions", int64_t{0});
  have_batch_ = false;
}

}  // namespace dlrec::embedding
