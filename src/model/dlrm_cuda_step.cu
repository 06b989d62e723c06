// The CUDA DLRM's forward, backward and updates, and the training step (model/dlrm_cuda_impl.h).
#include "model/dlrm_cuda_impl.h"

namespace dlrec::model::dlrm_cuda_impl {

// Keeps the GPU busy for about `ns` nanoseconds (one thread).
__global__ void gpu_sleep_kernel(long long ns) {
  const long long t0 = clock64();
  // clock64 counts SM cycles: 1.5 GHz or more on the GPUs we target, so ns cycles >= ns.
  while (clock64() - t0 < ns) __nanosleep(1000);
}

void DlrmCuda::mlp_forward(std::vector<DenseLayer>& mlp, const void* x, int64_t B,
                           cudaStream_t st, lt::Lt* lth, cublasHandle_t h) {
  const float one = 1.f, zero = 0.f;
  // DLREC_PROFILE: one phase per layer ("top mlp fwd 0", ...).
  static const auto names = [] {
    std::vector<std::string> v;
    for (const char* m : {"bottom", "top"})
      for (int i = 0; i < 16; ++i) v.push_back(std::string(m) + " mlp fwd " + std::to_string(i));
    return v;
  }();
  const size_t name0 = &mlp == &top_ ? 16 : 0;
  for (auto& l : mlp) {
    if (profile_ && &l != &mlp.front() && &l - &mlp.front() < 16)
      mark(names[name0 + static_cast<size_t>(&l - &mlp.front()) - 1].c_str());
    l.x = x;
    if (!half_) {
      float* y = l.y.data<float>();
      // Row-major y [B, out] = x [B, in] W^T, i.e. column-major y^T = W x^T.
      DLREC_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(l.out),
                                     static_cast<int>(B), static_cast<int>(l.in), &one,
                                     l.w.data<float>(), static_cast<int>(l.in),
                                     static_cast<const float*>(x), static_cast<int>(l.in), &zero,
                                     y, static_cast<int>(l.out)));
      cd::bias_act(y, l.b.data<float>(), B, l.out, l.relu, st);
      x = y;
      continue;
    }
    // Inference of a few rows (serving at batch 1..8): the warp-per-output kernel instead of a
    // GEMM that streams the whole weight matrix through a few thread blocks.
    if (!have_training_forward_ && B <= cd::kSkinnyRows) {
      bool done = false;
      with_half(fp16_, [&](auto h) {
        using H = decltype(h);
        done = cd::skinny_linear(static_cast<const H*>(l.wh.raw()), static_cast<const H*>(x), B,
                                 l.out, l.in_pad, l.out_f32 ? l.b.raw() : l.bh.raw(), l.relu,
                                 l.y.raw(), l.out_f32, st);
      });
      if (done) {
        l.aux_valid = false;  // no ReLU mask written (a backward needs a training forward)
        x = l.y.raw();
        continue;
      }
    }
    // 16-bit: column-major y^T [out, B] = Wh^T... with Wh stored [out, in_pad] row-major.
    lt::Gemm g = lt::Gemm::shape(true, false, l.out, B, l.in_pad, l.in_pad, l.in_pad, l.out);
    g.ab_type = h16_;
    g.d_type = l.out_f32 ? CUDA_R_32F : h16_;
    g.epi = l.relu ? lt::Epi::ReluAuxBias : lt::Epi::Bias;
    g.aux_ld = l.aux_ld;
    void* bias = l.out_f32 ? l.b.raw() : l.bh.raw();
    l.aux_valid = lth->run(g, l.wh.raw(), x, l.y.raw(), bias, l.relu ? l.aux.raw() : nullptr, st);
    if (!l.aux_valid) {
      DLREC_CUBLAS_CHECK(cublasGemmEx(
          h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(l.out), static_cast<int>(B),
          static_cast<int>(l.in_pad), &one, l.wh.raw(), h16_, static_cast<int>(l.in_pad),
          x, h16_, static_cast<int>(l.in_pad), &zero, l.y.raw(), g.d_type,
          static_cast<int>(l.out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      if (l.out_f32) cd::bias_act(l.y.data<float>(), l.b.data<float>(), B, l.out, l.relu, st);
      else
        with_half(fp16_, [&](auto h) {
          using H = decltype(h);
          cd::bias_act(hp<H>(l.y), hp<H>(l.bh), B, l.out, l.relu, st);
        });
    }
    l.aux_valid = l.aux_valid && l.relu;
    x = l.y.raw();
  }
}

const void* DlrmCuda::mlp_backward(std::vector<DenseLayer>& mlp, const void* dy, int64_t B,
                                   bool need_dx, cudaStream_t st, lt::Lt* lth, cublasHandle_t h,
                                   Tensor& partial) {
  const float one = 1.f, zero = 0.f;
  const int b = static_cast<int>(B);
  if (!half_) {
    for (size_t k = mlp.size(); k-- > 0;) {
      DenseLayer& l = mlp[k];
      // ReLU mask and bias gradient in one pass over dy.
      cd::mask_bias_grad(static_cast<const float*>(dy), l.relu ? l.y.data<float>() : nullptr,
                         l.relu ? l.dz.data<float>() : nullptr, partial.data<float>(),
                         l.db.data<float>(), B, l.out, st);
      const float* dz = l.relu ? l.dz.data<float>() : static_cast<const float*>(dy);
      const int in = static_cast<int>(l.in), out = static_cast<int>(l.out);
      // dW [out, in] = dz^T x: column-major dW^T [in, out] = x^T [in, B] dz [B, out].
      DLREC_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, &one,
                                     static_cast<const float*>(l.x), in, dz, out, &zero,
                                     l.dw.data<float>(), in));
      if (k > 0 || need_dx) {
        // dx [B, in] = dz W: column-major dx^T [in, B] = W^T [in, out] dz^T [out, B].
        DLREC_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, &one,
                                       l.w.data<float>(), in, dz, out, &zero, l.dx.data<float>(),
                                       in));
        dy = l.dx.raw();
      } else {
        dy = nullptr;
      }
    }
    return dy;
  }
  // 16-bit: `dy` is already the gradient of the last layer's pre-activation (its ReLU, if any,
  // was applied by whoever produced it); the previous layer's ReLU is applied to each dgrad.
  // Default: plain GEMMs, and after each dgrad one pass that masks it by the previous layer's
  // ReLU and sums that layer's bias gradient (mask_bias_grad). (cuBLASLt's BGRADB and DRELU
  // epilogues doing the same measured slower on an H100, bench/RESULTS.md.)
  const void* dz = dy;
  bool db_done = false;  // the bias gradient of layer k was summed by the pass after dgrad k+1
  for (size_t k = mlp.size(); k-- > 0;) {
    DenseLayer& l = mlp[k];
    const int in_pad = static_cast<int>(l.in_pad), out = static_cast<int>(l.out);
    // dW^T [in_pad, out] (f32) = x^T [in_pad, B] dz [B, out].
    DLREC_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, in_pad, out, b, &one, l.x, h16_,
                                    in_pad, dz, h16_, out, &zero, l.dw.raw(), CUDA_R_32F,
                                    in_pad, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (!db_done)
      with_half(fp16_, [&](auto h) {
        using H = decltype(h);
        cd::mask_bias_grad(static_cast<const H*>(dz), nullptr, nullptr, partial.data<float>(),
                           l.db.data<float>(), B, l.out, st);
      });
    db_done = false;
    if (k == 0 && !need_dx) return nullptr;
    // dx^T [in_pad, B] = Wh [in_pad, out] (column-major view) dz^T [out, B]; into the previous
    // layer's dz with its ReLU applied when there is one.
    DenseLayer* prev = k > 0 ? &mlp[k - 1] : nullptr;
    void* dst = prev ? prev->dz.raw() : l.dx.raw();
    void* tmp = prev ? l.dx.raw() : dst;
    DLREC_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, in_pad, b, out, &one,
                                    l.wh.raw(), h16_, in_pad, dz, h16_, out, &zero, tmp, h16_,
                                    in_pad, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (prev) {
      // dReLU and the previous layer's bias gradient in one pass.
      with_half(fp16_, [&](auto h) {
        using H = decltype(h);
        cd::mask_bias_grad(hp<H>(l.dx), hp<H>(prev->y), hp<H>(prev->dz), partial.data<float>(),
                           prev->db.data<float>(), B, prev->out, st);
      });
      db_done = true;
    }
    dz = dst;
  }
  return dz;
}

void DlrmCuda::dense_updates(std::vector<DenseLayer>& mlp, cudaStream_t st) {
  for (auto& l : mlp)
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::optimizer_step(l.w.data<float>(), l.dw.data<float>(),
                         adagrad_ ? l.sw.data<float>() : nullptr, l.out, l.in, l.in_pad,
                         half_ ? hp<H>(l.wh) : nullptr, l.in_pad, lr_ptr(), eps_, st, gscale());
      cd::optimizer_step(l.b.data<float>(), l.db.data<float>(),
                         adagrad_ ? l.sb.data<float>() : nullptr, 1, l.out, l.out,
                         half_ ? hp<H>(l.bh) : nullptr, l.out, lr_ptr(), eps_, st, gscale());
    });
}

void DlrmCuda::run_forward(bool training) {
  const int64_t B = fwd_rows_;
  have_training_forward_ = training;
  if (B == 0) return;
  const InputSlot& sl = inputs_->slots[cur_];
  // Bottom MLP on the side stream, beside the embedding lookup.
  cudaStream_t bs = side();
  const bool fork = bs != stream_;
  if (fork) {
    DLREC_CUDA_CHECK(cudaEventRecord(fork_, stream_));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(bs, fork_, 0));
  }
  const float* dense_in = infer_in_.dense ? infer_in_.dense : sl.d_dense.data<float>();
  const void* dense = dense_in;
  if (half_) {
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::to_half_padded(dense_in, B, num_dense_, hp<H>(dense_h_),
                         bottom_.front().in_pad, bs);
    });
    dense = dense_h_.raw();
  }
  if (!bottom_.empty()) {
    mlp_forward(bottom_, dense, B, bs, fork ? lt_side_.get() : lt_.get(),
                fork ? blas_side_ : blas_);
    dense = bottom_.back().y.raw();
  }
  if (fork) DLREC_CUDA_CHECK(cudaEventRecord(join_, bs));
  mark("bottom mlp fwd");
  const auto* offsets = infer_in_.offsets ? infer_in_.offsets : sl.d_offsets.data<int32_t>();
  const auto* keys =
      infer_in_.keys ? infer_in_.keys : static_cast<const uint32_t*>(sl.d_keys.raw());
  const int T = static_cast<int>(T_), d = static_cast<int>(dim_);
  if (half_)
    with_half(fp16_, [&](auto h) {
      ce::forward(tab_, offsets, keys, B, mean_, hp<decltype(h)>(emb_out_), stream_);
    });
  else ce::forward(tab_, offsets, keys, B, mean_, emb_out_.data<float>(), stream_);
  mark("embedding fwd");
  if (fork) DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
  if (half_)
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::dot_forward(static_cast<const H*>(dense), hp<H>(emb_out_), B, T, d, hp<H>(inter_),
                      inter_ld_, stream_);
    });
  else if (dot_)
    cd::dot_forward(static_cast<const float*>(dense), emb_out_.data<float>(), B, T, d,
                    inter_.data<float>(), inter_ld_, stream_);
  else
    cd::cat_forward(static_cast<const float*>(dense), emb_out_.data<float>(), B,
                    static_cast<int>(dense_dim_), T_ * dim_, inter_.data<float>(), stream_);
  mark("interaction fwd");
  mlp_forward(top_, inter_.raw(), B, stream_, lt_.get(), blas_);
  mark("top mlp fwd");
}

void DlrmCuda::run_backward_update() {
  const int64_t B = fwd_rows_;
  if (B == 0) return;
  trained_ = true;
  const InputSlot& sl = inputs_->slots[cur_];
  const void* dlog = half_ ? dlogits_h_.raw() : dlogits_.raw();
  const void* dinter = mlp_backward(top_, dlog, B, true, stream_, lt_.get(), blas_,
                                    bgrad_partial_);
  mark("top mlp bwd");
  const void* dense = bottom_.empty() ? sl.d_dense.raw() : bottom_.back().y.raw();
  const int T = static_cast<int>(T_), d = static_cast<int>(dim_);
  if (half_)
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::dot_backward(static_cast<const H*>(dense), hp<H>(emb_out_),
                       static_cast<const H*>(dinter), inter_ld_, B, T, d, bottom_.back().relu,
                       hp<H>(d_dense_), d_emb_.data<float>(), stream_);
    });
  else if (dot_)
    cd::dot_backward(static_cast<const float*>(dense), emb_out_.data<float>(),
                     static_cast<const float*>(dinter), inter_ld_, B, T, d, false,
                     d_dense_.data<float>(), d_emb_.data<float>(), stream_);
  else
    cd::cat_backward(static_cast<const float*>(dinter), B, static_cast<int>(dense_dim_),
                     T_ * dim_, d_dense_.data<float>(), d_emb_.data<float>(), stream_);
  mark("interaction bwd");
  // The bottom MLP's backward and update on the side stream, beside the embedding update.
  cudaStream_t bs = side();
  const bool fork = bs != stream_;
  if (fork) {
    DLREC_CUDA_CHECK(cudaEventRecord(fork_, stream_));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(bs, fork_, 0));
  }
  if (!bottom_.empty()) {
    mlp_backward(bottom_, d_dense_.raw(), B, false, bs, fork ? lt_side_.get() : lt_.get(),
                 fork ? blas_side_ : blas_, fork ? bgrad_partial_side_ : bgrad_partial_);
    if (!fp16_) dense_updates(bottom_, bs);
  }
  if (fork) DLREC_CUDA_CHECK(cudaEventRecord(join_, bs));
  if (fp16_) {
    // Every gradient exists before any update: check them, then update the scale and the
    // bottom MLP (again beside the embedding update).
    if (fork) DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    check_gradients(stream_);
    if (fork) {
      DLREC_CUDA_CHECK(cudaEventRecord(fork_, stream_));
      DLREC_CUDA_CHECK(cudaStreamWaitEvent(bs, fork_, 0));
    }
    dense_updates(bottom_, bs);
    if (fork) DLREC_CUDA_CHECK(cudaEventRecord(join_, bs));
  }
  mark("bottom mlp bwd+update");
  dense_updates(top_, stream_);
  mark("top optimizer");
  ce::backward_update(tab_, sl.d_offsets.data<int32_t>(),
                      static_cast<const uint32_t*>(sl.d_keys.raw()), B, fwd_nnz_, mean_,
                      d_emb_.data<float>(), adagrad_ ? ce::Update::Adagrad : ce::Update::SGD,
                      lr_ptr() + 1, eps_, key_bits_, scratch_, stream_, gscale());
  mark("embedding bwd+update");
  if (fork) DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
}

void DlrmCuda::step_body() {
  const InputSlot& sl = inputs_->slots[cur_];
  run_forward(true);
  have_training_forward_ = false;
  if (fp16_)  // dL/dlogits times the loss scale, in fp16
    cd::bce_with_logits(top_.back().y.data<float>(), sl.d_labels.data<float>(), fwd_rows_,
                        dlogits_.data<float>(), static_cast<double*>(loss_.raw()), stream_,
                        hp<f16>(dlogits_h_), ls_.scale, loss() == nn::LossKind::Mse);
  else
    cd::bce_with_logits(top_.back().y.data<float>(), sl.d_labels.data<float>(), fwd_rows_,
                        dlogits_.data<float>(), static_cast<double*>(loss_.raw()), stream_,
                        half_ ? hp<bf16>(dlogits_h_) : nullptr, loss() == nn::LossKind::Mse);
  mark("bce");
  run_backward_update();
}

Tensor DlrmCuda::forward(const io::Batch& batch, bool training) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  have_training_forward_ = false;
  // Phases are profiled in train_step, and here only in a model that never trained (the
  // serving engine's breakdown: `dlrec bench infer` with DLREC_PROFILE=1).
  const bool profile_here = profile_ && !trained_;
  if (profile_here) mark("begin");
  upload(batch, 0.f, 0.f);
  if (profile_here) {
    mark("h2d (+host packing)");
    // The GPU waits ~2 ms while the host queues the forward behind it, so that the phases
    // below measure the kernels back to back (as in a CUDA graph), not the launch gaps.
    gpu_sleep_kernel<<<1, 1, 0, stream_>>>(2000000);
    DLREC_CUDA_CHECK(cudaGetLastError());
    mark("(gpu sleep: launches queue up)");
  }
  run_forward(training);
  const int64_t B = fwd_rows_;
  // A copy: callers may keep logits across steps, the buffer is reused.
  Tensor logits = dev_tensor({B});
  if (B)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(logits.raw(), top_.back().y.raw(), sizeof(float) * B,
                                     cudaMemcpyDeviceToDevice, stream_));
  if (!training) DLREC_CUDA_CHECK(cudaEventRecord(inputs_->slots[cur_].free, stream_));
  // Callers read the logits with legacy-stream copies, which do not wait for our streams.
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profile_here) flush_profile();
  mark_names_.clear();
  return logits;
}

void DlrmCuda::backward_and_update(const Tensor& dlogits, double lr_scale) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(have_training_forward_,
              "DLRM: backward_and_update needs a forward(batch, training = true) before it");
  DLREC_CHECK(dlogits.dtype() == DType::F32 && dlogits.numel() == fwd_rows_,
              "DLRM: dlogits must be f32 with ", fwd_rows_, " values, got ",
              dtype_name(dlogits.dtype()), " ", shape_str(dlogits.shape()));
  DLREC_CHECK(!dlogits.device().is_cuda() || dlogits.device() == dev_,
              "DLRM: dlogits on ", dlogits.device().str(), ", the model is on ", dev_.str());
  DLREC_CHECK(lr_scale >= 0, "DLRM: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  InputSlot& sl = inputs_->slots[cur_];
  // The learning rates go through the slot's pinned buffer (its copy was waited for in
  // upload, and the next upload into it waits for this copy).
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  sl.lr[0] = static_cast<float>(oc_.lr * lr_scale);
  sl.lr[1] = static_cast<float>((oc_.embedding_lr >= 0 ? oc_.embedding_lr : oc_.lr) * lr_scale);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(sl.d_lr.raw(), sl.lr, sizeof(float) * 2,
                                   cudaMemcpyHostToDevice, stream_));
  if (fwd_rows_)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(dlogits_.raw(), dlogits.raw(), sizeof(float) * fwd_rows_,
                                     dlogits.device().is_cuda() ? cudaMemcpyDeviceToDevice
                                                                : cudaMemcpyHostToDevice,
                                     stream_));
  if (fp16_ && fwd_rows_)
    cd::scale_to_f16(dlogits_.data<float>(), fwd_rows_, ls_.scale, hp<f16>(dlogits_h_), stream_);
  else if (half_ && fwd_rows_)
    cd::to_half_padded(dlogits_.data<float>(), fwd_rows_, 1, hp<bf16>(dlogits_h_), 1, stream_);
  run_backward_update();
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, stream_));
  mark_names_.clear();
}

double DlrmCuda::train_step(const io::Batch& batch, double lr_scale, bool want_loss) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows,
              "DLRM: train_step needs one label per row");
  DLREC_CHECK(lr_scale >= 0, "DLRM: lr_scale must be >= 0, got ", lr_scale);
  mark("begin");
  const auto t0 = std::chrono::steady_clock::now();
  const float lr = static_cast<float>(oc_.lr * lr_scale);
  const float emb_lr =
      static_cast<float>((oc_.embedding_lr >= 0 ? oc_.embedding_lr : oc_.lr) * lr_scale);
  upload(batch, lr, emb_lr);
  if (profile_)
    host_pack_ms_ +=
        (seen_steps_ >= 3) *
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  mark("h2d (+host packing)");
  InputSlot& sl = inputs_->slots[cur_];
  run_step(sl, fwd_rows_, fwd_nnz_, graphs_, stream_, [&] { step_body(); });
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, stream_));
  flush_profile();
  if (!want_loss) return std::numeric_limits<double>::quiet_NaN();
  double loss = 0;
  DLREC_CUDA_CHECK(
      cudaMemcpyAsync(&loss, loss_.raw(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return loss;
}

}  // namespace dlrec::model::dlrm_cuda_impl
