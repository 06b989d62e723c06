// The tiny graph models and optimizers of the GPU-vs-CPU graph tests
// (tests/model/graph_cuda_test.cc), shared with bench/parity_order_noise.cc: 5 tables of 3..100
// rows (make_layout(4, {50, 7, 100, 3, 20}) in test_batches.h), dim 8.
#pragma once

namespace dlrec::model::testing {

inline constexpr const char* kSgd = R"({"type": "sgd", "lr": 0.05})";
inline constexpr const char* kAdagrad =
    R"({"type": "adagrad", "lr": 0.02, "embedding_lr": 0.05, "adagrad_init": 0.01})";

// DCNv2, stacked: the deep part reads the cross network's output; low-rank cross layers.
inline constexpr const char* kDcnStacked = R"(
  {"name": "dense", "type": "dense"},
  {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [16, 8], "relu_last": true},
  {"name": "emb", "type": "embedding", "dim": 8},
  {"name": "x0", "type": "concat", "inputs": ["bottom", "emb"]},
  {"name": "cross", "type": "cross", "input": "x0", "num_layers": 3, "low_rank": 8},
  {"name": "top", "type": "mlp", "input": "cross", "sizes": [16, 8, 1]},
  {"name": "logit", "type": "output", "input": "top"})";

// DCNv2, parallel: cross network (full rank) and an MLP both read x0 = [dense, emb]; x0 is
// 4 + 5 * 8 = 44 wide (rows padded to 48 in bf16).
inline constexpr const char* kDcnParallel = R"(
  {"name": "dense", "type": "dense"},
  {"name": "emb", "type": "embedding", "dim": 8, "pooling": "mean"},
  {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2},
  {"name": "deep", "type": "mlp", "input": "x0", "sizes": [32, 16], "relu_last": true},
  {"name": "both", "type": "concat", "inputs": ["cross", "deep"]},
  {"name": "head", "type": "mlp", "input": "both", "sizes": [1]},
  {"name": "logit", "type": "output", "input": "head"})";

// DLRM: bottom MLP, embeddings, dot interaction, top MLP.
inline constexpr const char* kDlrm = R"(
  {"name": "dense", "type": "dense"},
  {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [16, 8], "relu_last": true},
  {"name": "emb", "type": "embedding", "dim": 8},
  {"name": "inter", "type": "dot", "inputs": ["bottom", "emb"]},
  {"name": "top", "type": "mlp", "input": "inter", "sizes": [16, 1]},
  {"name": "logit", "type": "output", "input": "top"})";

// Every other path: a dot over three inputs (gathered), the embeddings feeding two layers (their
// gradients summed), two logits added, the dense features read by three layers.
inline constexpr const char* kMixed = R"(
  {"name": "dense", "type": "dense"},
  {"name": "b1", "type": "mlp", "input": "dense", "sizes": [8], "relu_last": true},
  {"name": "b2", "type": "mlp", "input": "dense", "sizes": [8]},
  {"name": "emb", "type": "embedding", "dim": 8},
  {"name": "inter", "type": "dot", "inputs": ["b1", "emb", "b2"]},
  {"name": "head", "type": "mlp", "input": "inter", "sizes": [8, 1]},
  {"name": "deep_in", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [16, 1]},
  {"name": "sum", "type": "add", "inputs": ["deep", "head"]},
  {"name": "logit", "type": "output", "input": "sum"})";

// DeepFM: first-order (wide) + second-order (fm over the embeddings, read in place) + deep.
inline constexpr const char* kDeepFm = R"(
  {"name": "dense", "type": "dense"},
  {"name": "first_order", "type": "wide", "features": "all"},
  {"name": "emb", "type": "embedding", "dim": 8},
  {"name": "fm", "type": "fm", "inputs": ["emb"]},
  {"name": "deep_in", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [16, 1]},
  {"name": "sum", "type": "add", "inputs": ["first_order", "fm", "deep"]},
  {"name": "logit", "type": "output", "input": "sum"})";

// DeepFM variant: the fm over two inputs (a bottom MLP's 8-vector and the embeddings: gathered,
// its gradient routed to both), mean pooling in both table layers.
inline constexpr const char* kDeepFmGathered = R"(
  {"name": "dense", "type": "dense"},
  {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [8], "relu_last": true},
  {"name": "first_order", "type": "wide", "pooling": "mean"},
  {"name": "emb", "type": "embedding", "dim": 8, "pooling": "mean"},
  {"name": "fm", "type": "fm", "inputs": ["bottom", "emb"]},
  {"name": "deep_in", "type": "concat", "inputs": ["bottom", "emb"]},
  {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [16, 1]},
  {"name": "sum", "type": "add", "inputs": ["first_order", "fm", "deep"]},
  {"name": "logit", "type": "output", "input": "sum"})";

// Wide & Deep (configs/wide_deep.json without its per-layer FTRL optimizer).
inline constexpr const char* kWideDeep = R"(
  {"name": "dense", "type": "dense"},
  {"name": "wide", "type": "wide", "features": "all"},
  {"name": "emb", "type": "embedding", "dim": 8},
  {"name": "deep_in", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [32, 16, 1]},
  {"name": "sum", "type": "add", "inputs": ["wide", "deep"]},
  {"name": "logit", "type": "output", "input": "sum"})";

// Logistic regression over the one-hot features: a wide layer and no embedding layer.
inline constexpr const char* kWideOnly = R"(
  {"name": "wide", "type": "wide"},
  {"name": "logit", "type": "output", "input": "wide"})";

}  // namespace dlrec::model::testing
