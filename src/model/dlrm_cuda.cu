// The CUDA DLRM: building the model (validation, device resources, parameters, tables),
// buffers and step inputs, parameters and state for checkpoints. The design is described in
// model/dlrm_cuda_impl.h.
#include "model/dlrm_cuda_impl.h"

namespace dlrec::model::dlrm_cuda_impl {

void DlrmCuda::mark(const char* phase) {
  if (!profile_) return;
  const size_t i = mark_names_.size();
  if (i == events_.size()) events_.emplace_back(dev_index_, /*timing=*/true);
  DLREC_CUDA_CHECK(cudaEventRecord(events_[i], stream_));
  mark_names_.push_back(phase);
}

void DlrmCuda::flush_profile() {
  if (!profile_ || mark_names_.empty()) return;
  DLREC_CUDA_CHECK(cudaEventSynchronize(events_[mark_names_.size() - 1]));
  if (++seen_steps_ > 3) {  // the first steps pay for cuBLAS' heuristics and lazy loading
    ++profiled_steps_;
    for (size_t i = 1; i < mark_names_.size(); ++i) {
      float ms = 0;
      DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
      auto it = std::find_if(phase_ms_.begin(), phase_ms_.end(),
                             [&](const auto& p) { return p.first == mark_names_[i]; });
      if (it == phase_ms_.end()) phase_ms_.emplace_back(mark_names_[i], ms);
      else it->second += ms;
    }
  }
  mark_names_.clear();
}

DlrmCuda::DlrmCuda(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
                   Device device, uint64_t seed, const std::string& precision,
                   const DlrmCudaOptions& options)
    : mc_(mc), oc_(oc), layout_(layout), dev_(device), dev_index_(device.index),
      prec_(parse_precision(precision)), dim_(mc.embedding_dim) {
  cuda::require_device(dev_index_);
  DeviceGuard g(dev_index_);
  fp16_ = prec_ == Precision::FP16;
  half_ = prec_ == Precision::BF16 || fp16_;
  h16_ = fp16_ ? CUDA_R_16F : CUDA_R_16BF;
  hdt_ = fp16_ ? DType::F16 : DType::BF16;
  DLREC_CHECK(layout.num_dense >= 0, "DLRM: negative number of dense features");
  DLREC_CHECK(dim_ > 0, "DLRM: embedding_dim must be positive");
  DLREC_CHECK(!mc.top_mlp.empty() && mc.top_mlp.back() == 1,
              "DLRM: the top MLP must end in 1 output (the logit)");
  T_ = static_cast<int64_t>(layout.cardinalities.size());
  num_dense_ = layout.num_dense;
  DLREC_CHECK(T_ + num_dense_ > 0, "DLRM: the data has no features");
  dot_ = mc.interaction == "dot";
  DLREC_CHECK(dot_ || mc.interaction == "cat", "unknown interaction '", mc.interaction,
              "' (expected dot or cat)");
  if (dot_)
    DLREC_CHECK(num_dense_ > 0,
                "DLRM: the dot interaction needs dense features (the data has none); use "
                "\"interaction\": \"cat\"");
  if (half_) {
    DLREC_CHECK(dot_ && !mc.bottom_mlp.empty(),
                precision, " precision supports DLRM with the dot interaction and a bottom MLP; "
                "use \"precision\": \"fp32\" or \"tf32\" for this model");
    auto check_sizes = [](const std::vector<int64_t>& sizes, const char* name) {
      for (size_t i = 0; i < sizes.size(); ++i)
        DLREC_CHECK((i + 1 == sizes.size() && sizes[i] == 1) || sizes[i] % 8 == 0,
                    "16-bit precision needs MLP sizes that are multiples of 8 ",
                    "(tensor-core alignment): ", name, "[", i, "] = ", sizes[i]);
    };
    check_sizes(mc.bottom_mlp, "model.bottom_mlp");
    check_sizes(mc.top_mlp, "model.top_mlp");
  }
  mean_ = nn::parse_pooling(mc.pooling) == nn::Pooling::Mean;
  const nn::OptimizerKind kind = nn::parse_optimizer(oc.type);
  DLREC_CHECK(kind == nn::OptimizerKind::SGD || kind == nn::OptimizerKind::Adagrad,
              "the CUDA DLRM supports the sgd and adagrad optimizers, not '", oc.type,
              "' (train it on the CPU)");
  adagrad_ = kind == nn::OptimizerKind::Adagrad;
  eps_ = static_cast<float>(oc.adagrad_eps);
  init_acc_ = static_cast<float>(oc.adagrad_init);
  DLREC_CHECK(eps_ >= 0 && init_acc_ >= 0,
              "Optimizer: eps and the initial accumulator must be >= 0");

  DLREC_CHECK(options.infer_chunk >= 256 && options.infer_chunk <= 65536 &&
                  (options.infer_chunk & (options.infer_chunk - 1)) == 0,
              "CUDA DLRM: infer_chunk must be a power of two in [256, 65536], got ",
              options.infer_chunk);
  DLREC_CHECK(options.infer_pack_threads >= 0 && options.infer_pack_threads <= 256,
              "CUDA DLRM: infer_pack_threads must be in [0, 256], got ",
              options.infer_pack_threads);
  DLREC_CHECK(options.infer_fused_rows >= 0 && options.infer_fused_rows <= fused_infer::kMaxRows,
              "CUDA DLRM: infer_fused_rows must be in [0, ", fused_infer::kMaxRows, "], got ",
              options.infer_fused_rows);
  DLREC_CHECK(options.infer_fused_blocks >= 0 && options.infer_fused_blocks <= 65536,
              "CUDA DLRM: infer_fused_blocks must be in [0, 65536], got ",
              options.infer_fused_blocks);
  DLREC_CHECK(std::isfinite(oc.loss_scale_init) && oc.loss_scale_init >= 1 &&
                  oc.loss_scale_init <= 1e38,
              "optimizer.loss_scale_init must be a number in [1, 1e38], got ", oc.loss_scale_init);
  DLREC_CHECK(oc.loss_scale_growth_interval >= 1 &&
                  oc.loss_scale_growth_interval <= std::numeric_limits<int>::max(),
              "optimizer.loss_scale_growth_interval must be a positive step count, got ",
              oc.loss_scale_growth_interval);
  growth_interval_ = static_cast<int>(oc.loss_scale_growth_interval);
  // DLREC_PROFILE=1 (a diagnostic: per-phase device times printed at destruction) runs
  // everything on one stream without graphs.
  const char* prof = std::getenv("DLREC_PROFILE");
  profile_ = prof && prof[0] == '1';
  graphs_ = !profile_ && options.cuda_graphs;
  overlap_ = !profile_;
  infer_chunk_ = options.infer_chunk;
  pack_threads_ = options.infer_pack_threads > 0
                      ? options.infer_pack_threads
                      : std::max(1, std::min(8, static_cast<int>(
                                                     std::thread::hardware_concurrency()) / 2));
  fused_rows_ = options.infer_fused_rows;
  fused_ = fused_rows_ > 0;
  fused_blocks_ = options.infer_fused_blocks;
  // DLREC_INFER_TIMING=1 (a diagnostic): predict()'s packing, copy and graph times, printed
  // at destruction.
  if (const char* it = std::getenv("DLREC_INFER_TIMING"); it && it[0] == '1') {
    timing_ = true;
    for (auto& e : timing_ev_) e = gpu::Event(dev_index_, /*timing=*/true);
  }
  create_gpu_resources();
  inputs_ = std::make_unique<StepInputs>(dev_);
  build_parameters(seed);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DlrmCuda::build_parameters(uint64_t seed) {
  // Dense layers: initialised on the CPU exactly as the CPU model does, then copied.
  auto make_mlp = [&](int64_t in, const std::vector<int64_t>& sizes, bool relu_last,
                      uint64_t s, std::vector<DenseLayer>& out) {
    nn::MLP cpu(in, sizes, relu_last);
    cpu.init(s);
    for (auto& l : cpu.layers()) {
      DenseLayer d;
      d.in = l.in_features();
      d.in_pad = half_ ? round_up(d.in, 8) : d.in;
      d.out = l.out_features();
      d.relu = l.activation() == nn::Activation::ReLU;
      d.w = l.weight().value.to(dev_);
      d.b = l.bias().value.to(dev_);
      d.dw = dev_tensor({d.out, d.in_pad});
      d.db = dev_tensor({d.out});
      if (half_) {
        d.wh = dev_tensor({d.out, d.in_pad}, hdt_);
        d.bh = dev_tensor({d.out}, hdt_);
        d.aux_ld = round_up(d.out, 128);
      }
      if (adagrad_) {
        d.sw = dev_tensor({d.out, d.in});
        d.sb = dev_tensor({d.out});
        ce::fill(d.sw.data<float>(), d.sw.numel(), init_acc_, stream_);
        ce::fill(d.sb.data<float>(), d.sb.numel(), init_acc_, stream_);
      }
      out.push_back(std::move(d));
    }
  };
  dense_dim_ = num_dense_;
  if (num_dense_ > 0 && !mc_.bottom_mlp.empty()) {
    make_mlp(num_dense_, mc_.bottom_mlp, true, nn::derive_seed(seed, 1), bottom_);
    dense_dim_ = bottom_.back().out;
  }
  if (dot_ && dense_dim_ != dim_)
    fail("DLRM: the dot interaction needs the bottom MLP to output embedding_dim = ", dim_,
         " values, but it outputs ", dense_dim_,
         mc_.bottom_mlp.empty() ? " (no bottom MLP: the dense feature count)"
                               : " (set the last bottom_mlp size to embedding_dim)");
  const int64_t n = T_ + 1;
  inter_out_ = dot_ ? dim_ + n * (n - 1) / 2 : dense_dim_ + T_ * dim_;
  inter_ld_ = half_ ? round_up(inter_out_, 8) : inter_out_;
  make_mlp(inter_out_, mc_.top_mlp, false, nn::derive_seed(seed, 2), top_);
  if (half_) {
    for (auto* mlp : {&bottom_, &top_})
      for (auto& l : *mlp) l.out_f32 = false;
    top_.back().out_f32 = true;
    refresh_shadows();
  }

  // Tables: initialised on the device, identical to EmbeddingBag::init.
  const uint64_t emb_seed = nn::derive_seed(seed, 3);
  uint64_t total_rows = 0;
  std::vector<float*> wp, sp;
  for (int64_t t = 0; t < T_; ++t) {
    const int64_t rows = layout_.cardinalities[t];
    DLREC_CHECK(rows > 0, "DLRM: categorical feature ", t, " has cardinality ", rows,
                "; every table needs rows");
    row_base_host_.push_back(static_cast<uint32_t>(total_rows));
    total_rows += static_cast<uint64_t>(rows);
    DLREC_CHECK(total_rows < (uint64_t{1} << 32), "CUDA DLRM: more than 2^32 embedding rows in "
                "all tables together are not supported");
    Tensor w = dev_tensor({rows, dim_});
    ce::init_uniform(w.data<float>(), w.numel(), nn::derive_seed(emb_seed, t),
                     std::sqrt(1.0 / static_cast<double>(rows)), stream_);
    wp.push_back(w.data<float>());
    tables_.push_back(w);
    if (adagrad_) {
      Tensor st = dev_tensor({rows, dim_});
      ce::fill(st.data<float>(), st.numel(), init_acc_, stream_);
      sp.push_back(st.data<float>());
      table_states_.push_back(st);
    }
  }
  key_bits_ = 1;
  while (key_bits_ < 32 && (uint64_t{1} << key_bits_) < total_rows) ++key_bits_;
  auto upload_vec = [&](const void* src, size_t bytes) {
    Tensor t = dev_tensor({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8);
    if (bytes) copy_bytes(t.raw(), dev_, src, Device::cpu(), bytes);
    return t;
  };
  table_ptrs_ = upload_vec(wp.data(), wp.size() * sizeof(float*));
  state_ptrs_ = upload_vec(sp.data(), sp.size() * sizeof(float*));
  row_base_ = upload_vec(row_base_host_.data(), row_base_host_.size() * sizeof(uint32_t));
  tab_.weights = static_cast<float* const*>(table_ptrs_.raw());
  tab_.states = adagrad_ ? static_cast<float* const*>(state_ptrs_.raw()) : nullptr;
  tab_.row_base = static_cast<const uint32_t*>(row_base_.raw());
  tab_.num_tables = static_cast<int>(T_);
  tab_.dim = static_cast<int>(dim_);
  loss_ = dev_tensor({8}, DType::U8);
  if (fp16_) {
    // scale, gscale (f32), overflow, good_steps (i32), skipped (i64)
    ls_mem_ = dev_tensor({32}, DType::U8);
    char* m = static_cast<char*>(ls_mem_.raw());
    ls_.scale = reinterpret_cast<float*>(m);
    ls_.gscale = reinterpret_cast<float*>(m + 4);
    ls_.overflow = reinterpret_cast<int*>(m + 8);
    ls_.good_steps = reinterpret_cast<int*>(m + 12);
    ls_.skipped = reinterpret_cast<int64_t*>(m + 16);
    const float scale = static_cast<float>(oc_.loss_scale_init);
    const float init[2] = {scale, 1.f / scale};
    DLREC_CUDA_CHECK(cudaMemsetAsync(m, 0, 32, stream_));
    DLREC_CUDA_CHECK(cudaMemcpyAsync(m, init, sizeof init, cudaMemcpyHostToDevice, stream_));
    // Every dense gradient (f32): the checks cover them and d_emb_ (sized per batch).
    std::vector<const float*> gp;
    std::vector<int64_t> gc;
    for (auto* mlp : {&bottom_, &top_})
      for (auto& l : *mlp) {
        gp.push_back(l.dw.data<float>());
        gc.push_back(l.dw.numel());
        gp.push_back(l.db.data<float>());
        gc.push_back(l.db.numel());
      }
    num_grads_ = static_cast<int>(gp.size());
    grad_ptrs_ = upload_vec(gp.data(), gp.size() * sizeof(float*));
    grad_counts_ = upload_vec(gc.data(), gc.size() * sizeof(int64_t));
  }
}

void DlrmCuda::create_gpu_resources() {
  // Non-blocking streams: another model in the process (serving instances) may copy on the
  // legacy stream while this one captures a CUDA graph, which blocking streams turn into an
  // error. Work handed out (forward's logits, parameters()) is synchronised before it is
  // returned, and after parameters() exposed the weights, the next step first waits for the
  // legacy stream (where Tensor copies and fills run).
  res_ = gpu::DeviceResources::get(dev_index_);
  stream_ = gpu::Stream(dev_index_);
  copy_ = gpu::Stream(dev_index_);
  side_ = gpu::Stream(dev_index_);
  fork_ = gpu::Event(dev_index_);
  join_ = gpu::Event(dev_index_);
  // A cuBLAS handle per compute stream, each with its own 32 MiB workspace (pooled per device).
  const bool tf32 = prec_ == Precision::TF32;
  blas_ = res_->blas(stream_, tf32);
  blas_side_ = res_->blas(side_, tf32);
  if (half_) {
    lt_ = std::make_unique<lt::Lt>(res_->blas_lt());
    lt_side_ = std::make_unique<lt::Lt>(res_->blas_lt());
  }
}

void DlrmCuda::check_gradients(cudaStream_t st) {
  if (!fp16_) return;
  cd::check_finite(static_cast<const float* const*>(grad_ptrs_.raw()),
                   static_cast<const int64_t*>(grad_counts_.raw()), num_grads_, ls_.overflow, st);
  cd::check_finite(d_emb_.data<float>(), fwd_rows_ * T_ * dim_, ls_.overflow, st);
  cd::loss_scale_update(ls_, growth_interval_, st);
}

void DlrmCuda::refresh_shadows() {
  if (!half_) return;
  for (auto* mlp : {&bottom_, &top_})
    for (auto& l : *mlp) {
      with_half(fp16_, [&](auto h) {
        using H = decltype(h);
        cd::to_half_padded(l.w.data<float>(), l.out, l.in, hp<H>(l.wh), l.in_pad, stream_);
        cd::to_half_padded(l.b.data<float>(), 1, l.out, hp<H>(l.bh), l.out, stream_);
      });
    }
  shadows_stale_ = false;
}

void DlrmCuda::absorb_external_writes() {
  if (exposed_) {
    DLREC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    exposed_ = false;
  }
  if (shadows_stale_) refresh_shadows();
}

void DlrmCuda::drop_graphs() {
  for (auto& bk : buckets_)
    if (bk) bk->graph.reset();
  if (inputs_) inputs_->drop_graphs();
}

DlrmCuda::~DlrmCuda() {
  // The members release themselves (streams first, after their work is done); what is here
  // waits for the work and prints the diagnostics.
  for (cudaStream_t st : {copy_.get(), side_.get(), stream_.get()})
    if (st) cudaStreamSynchronize(st);
  if (profile_ && profiled_steps_ > 0) {
    double total = 0;
    for (auto& p : phase_ms_) total += p.second;
    std::fprintf(stderr, "[profile] %lld steps of batch %lld, device ms per step by phase:\n",
                 static_cast<long long>(profiled_steps_), static_cast<long long>(fwd_rows_));
    for (auto& p : phase_ms_)
      std::fprintf(stderr, "[profile]   %-24s %8.3f ms  %5.1f%%\n", p.first.c_str(),
                   p.second / profiled_steps_, 100.0 * p.second / std::max(total, 1e-9));
    std::fprintf(stderr, "[profile]   %-24s %8.3f ms (host packing, inside h2d)\n", "host pack",
                 host_pack_ms_ / profiled_steps_);
    std::fprintf(stderr, "[profile]   %-24s %8.3f ms\n", "total", total / profiled_steps_);
    if (lt_)
      std::fprintf(stderr, "[profile]   cuBLASLt plans without an algorithm (fallbacks): %d\n",
                   lt_->unsupported_count() + lt_side_->unsupported_count());
  }
  if (fp16_ && trained_) {
    float scale = 0;
    int64_t skipped = 0;
    if (cudaMemcpy(&scale, ls_.scale, sizeof scale, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(&skipped, ls_.skipped, sizeof skipped, cudaMemcpyDeviceToHost) == cudaSuccess)
      std::fprintf(stderr, "[fp16] loss scale %g at the end; %lld step(s) skipped (gradient "
                   "overflow)\n", scale, static_cast<long long>(skipped));
  }
  if (timing_ && timing_calls_ > 0)
    std::fprintf(stderr, "[infer timing] %lld calls of %lld rows (after 20 warm-up calls), mean "
                 "us: host packing %.1f (%d thread(s)), device: input copy %.1f + graph %.1f, "
                 "wall %.1f\n",
                 static_cast<long long>(timing_calls_), static_cast<long long>(timing_rows_),
                 timing_sum_[0] / timing_calls_, pack_threads_, timing_sum_[1] / timing_calls_,
                 timing_sum_[2] / timing_calls_, timing_sum_[3] / timing_calls_);
}

void DlrmCuda::check_batch(const io::Batch& b) const {
  cuda_step::check_batch(b, num_dense_, T_, "DLRM");
}

void DlrmCuda::ensure_capacity(int64_t B, int64_t nnz) {
  if (B <= cap_b_ && nnz <= cap_nnz_) return;
  for (cudaStream_t st : {copy_.get(), side_.get(), stream_.get()})
    DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
  drop_graphs();  // they hold the old buffers
  const int64_t nb = std::max(B, cap_b_), nn_ = std::max<int64_t>(std::max(nnz, cap_nnz_), 1);
  DLREC_CHECK(nn_ < (int64_t{1} << 31) && nb * T_ < (int64_t{1} << 31),
              "CUDA DLRM: a batch with ", nn_, " ids is too large (int32 offsets)");
  cap_b_ = nb;
  cap_nnz_ = nn_;
  const int64_t cb = std::max<int64_t>(nb, 1);
  const DType act = half_ ? hdt_ : DType::F32;
  emb_out_ = dev_tensor({cb, std::max<int64_t>(T_, 1), dim_}, act);
  d_emb_ = dev_tensor({cb, std::max<int64_t>(T_, 1), dim_});  // f32: the tables' gradients
  inter_ = dev_tensor({cb, inter_ld_}, act);
  d_dense_ = dev_tensor({cb, std::max<int64_t>(dense_dim_, 1)}, act);
  dlogits_ = dev_tensor({cb});
  if (half_) {
    dlogits_h_ = dev_tensor({cb}, hdt_);
    dense_h_ = dev_tensor({cb, bottom_.front().in_pad}, hdt_);
  }
  int64_t max_out = 1;
  for (auto* mlp : {&bottom_, &top_})
    for (auto& l : *mlp) {
      max_out = std::max(max_out, l.out);
      l.y = dev_tensor({cb, l.out}, l.out_f32 ? DType::F32 : act);
      l.dz = l.relu ? dev_tensor({cb, l.out}, act) : Tensor();
      l.dx = dev_tensor({cb, l.in_pad}, act);
      if (half_ && l.relu) l.aux = dev_tensor({cb * l.aux_ld / 8}, DType::U8);
    }
  bgrad_partial_ = dev_tensor({std::max<int64_t>(cd::bias_grad_chunks(cb), 1), max_out});
  bgrad_partial_side_ = dev_tensor({std::max<int64_t>(cd::bias_grad_chunks(cb), 1), max_out});
  const size_t sb = ce::scratch_bytes(nn_, key_bits_, static_cast<int>(dim_));
  scratch_mem_ = dev_tensor({static_cast<int64_t>(sb)}, DType::U8);
  scratch_ = ce::carve(scratch_mem_.raw(), nn_, key_bits_, static_cast<int>(dim_));
  ce::prepare(scratch_, stream_);
  inputs_->allocate(cb, nn_, num_dense_, T_);
}

void DlrmCuda::upload(const io::Batch& b, float lr, float emb_lr) {
  const int64_t B = b.rows;
  int64_t nnz = 0;
  for (int64_t t = 0; t < T_; ++t) nnz += b.cat_offsets[t][B] - b.cat_offsets[t][0];
  ensure_capacity(B, nnz);
  cur_ = inputs_->upload(b, layout_.cardinalities, &row_base_host_, lr, emb_lr,
                         overlap_ ? copy_ : stream_, stream_, "DLRM");
  fwd_rows_ = B;
  fwd_nnz_ = nnz;
  absorb_external_writes();
}


void DlrmCuda::synchronize() {
  DeviceGuard g(dev_index_);
  for (cudaStream_t st : {copy_.get(), side_.get(), stream_.get()})
    DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
}

std::vector<NamedTensor> DlrmCuda::parameters() {
  synchronize();
  shadows_stale_ = half_;  // the caller may write into the f32 masters
  exposed_ = true;
  std::vector<NamedTensor> out;
  auto add = [&](std::vector<DenseLayer>& mlp, const std::string& prefix) {
    for (size_t k = 0; k < mlp.size(); ++k) {
      out.emplace_back(prefix + "." + std::to_string(k) + ".weight", mlp[k].w);
      out.emplace_back(prefix + "." + std::to_string(k) + ".bias", mlp[k].b);
    }
  };
  add(bottom_, "bottom");
  add(top_, "top");
  for (size_t t = 0; t < tables_.size(); ++t)
    out.emplace_back("emb." + std::to_string(t) + ".weight", tables_[t]);
  return out;
}

std::vector<NamedTensor> DlrmCuda::optimizer_state() {
  synchronize();
  exposed_ = true;
  std::vector<NamedTensor> out;
  // fp16: the loss-scale state (f32 scale, f32 1/scale, i32 overflow flag, i32 good steps,
  // i64 skipped steps), so that a resumed run continues with the same scale.
  if (fp16_) out.emplace_back("amp.loss_scale", ls_mem_);
  if (!adagrad_) return out;
  const char* suffix = ".adagrad";
  auto add = [&](std::vector<DenseLayer>& mlp, const std::string& prefix) {
    for (size_t k = 0; k < mlp.size(); ++k) {
      out.emplace_back(prefix + "." + std::to_string(k) + ".weight" + suffix, mlp[k].sw);
      out.emplace_back(prefix + "." + std::to_string(k) + ".bias" + suffix, mlp[k].sb);
    }
  };
  add(bottom_, "bottom");
  add(top_, "top");
  for (size_t t = 0; t < table_states_.size(); ++t)
    out.emplace_back("emb." + std::to_string(t) + ".weight" + suffix, table_states_[t]);
  return out;
}

}  // namespace dlrec::model::dlrm_cuda_impl

namespace dlrec::model {

std::unique_ptr<CudaModel> make_dlrm_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                          const io::ShardLayout& layout, Device device,
                                          uint64_t seed, const std::string& precision,
                                          const DlrmCudaOptions& options) {
  DLREC_CHECK(device.is_cuda(), "make_dlrm_cuda: ", device.str(), " is not a CUDA device");
  return std::make_unique<dlrm_cuda_impl::DlrmCuda>(model, opt, layout, device, seed, precision, options);
}

}  // namespace dlrec::model
