// AUC and log loss of a validation set on a CUDA device; see metrics.h.
//
// AUC: the probabilities are sorted ascending with their labels (CUB radix sort); for each tie
// group of equal probabilities, a positive counts the negatives before its group plus half the
// negatives inside it (the Mann-Whitney statistic, as roc_auc does on the CPU). Group bounds
// come from a max-scan of group starts and a reverse min-scan of group ends; the sums are in
// double.
#include <cub/device/device_radix_sort.cuh>
#include <thrust/device_vector.h>
#include <thrust/count.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/reverse_iterator.h>
#include <thrust/scan.h>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <limits>

#include "core/cuda_check.h"
#include "dlrec/core/device.h"
#include "dlrec/train/metrics.h"

namespace dlrec::train {
namespace {

struct Sigmoid {
  __device__ float operator()(float x) const { return 1.f / (1.f + expf(-x)); }
};

struct LogLossTerm {
  const float* p;
  const float* y;
  __device__ double operator()(int64_t i) const {
    const double q = fmin(fmax(double(p[i]), 1e-7), 1.0 - 1e-7);
    const double t = y[i];
    return -(t * log(q) + (1.0 - t) * log(1.0 - q));
  }
};

struct GroupStart {  // i where a tie group starts, else 0 (then max-scanned)
  const float* k;
  __device__ int64_t operator()(int64_t i) const { return (i == 0 || k[i] != k[i - 1]) ? i : 0; }
};

struct GroupEnd {  // one past the group's last element where a group ends, else n (min-scanned)
  const float* k;
  int64_t n;
  __device__ int64_t operator()(int64_t i) const {
    return (i == n - 1 || k[i] != k[i + 1]) ? i + 1 : n;
  }
};

struct IsNan {
  __device__ bool operator()(float x) const { return isnan(x); }
};

struct Negative {
  const float* y;
  __device__ int64_t operator()(int64_t i) const { return y[i] > 0.5f ? 0 : 1; }
};

struct PositiveCredit {
  const float* y;
  const int64_t* neg_before;  // inclusive scan of negatives: negatives in [0, i]
  const int64_t* start;
  const int64_t* end;
  __device__ double operator()(int64_t i) const {
    if (!(y[i] > 0.5f)) return 0.0;
    const int64_t s = start[i], e = end[i];
    const int64_t before = s > 0 ? neg_before[s - 1] : 0;
    const int64_t inside = neg_before[e - 1] - before;
    return double(before) + 0.5 * double(inside);
  }
};

}  // namespace

DeviceMetrics metrics_from_logits_cuda(const float* logits, const float* labels, int64_t n,
                                       int device) {
  DeviceMetrics r;
  DLREC_CHECK(n > 0, "AUC of no rows: there is nothing to evaluate");
  int prev = 0;
  DLREC_CUDA_CHECK(cudaGetDevice(&prev));
  DLREC_CUDA_CHECK(cudaSetDevice(device));
  try {
    auto pol = thrust::cuda::par;
    thrust::device_vector<float> probs(n), probs_sorted(n), labels_sorted(n);
    thrust::transform(pol, thrust::device_pointer_cast(logits),
                      thrust::device_pointer_cast(logits) + n, probs.begin(), Sigmoid());
    const float* p = thrust::raw_pointer_cast(probs.data());
    // NaN has no rank (the radix sort would place it by its bits, and every NaN would be a
    // group of its own): refused and counted, as roc_auc does on the host.
    const int64_t nan_scores = thrust::count_if(pol, probs.begin(), probs.end(), IsNan());
    if (nan_scores > 0) {
      cudaSetDevice(prev);
      fail("AUC: ", nan_scores, " of ", n,
           " scores are NaN (the model's outputs are not numbers; its weights have diverged or "
           "hold NaN)");
    }
    r.logloss = thrust::transform_reduce(pol, thrust::counting_iterator<int64_t>(0),
                                         thrust::counting_iterator<int64_t>(n),
                                         LogLossTerm{p, labels}, 0.0, thrust::plus<double>()) /
                static_cast<double>(n);
    size_t temp = 0;
    DLREC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, p,
                                                     thrust::raw_pointer_cast(probs_sorted.data()),
                                                     labels,
                                                     thrust::raw_pointer_cast(labels_sorted.data()),
                                                     n));
    thrust::device_vector<char> temp_mem(temp);
    DLREC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        thrust::raw_pointer_cast(temp_mem.data()), temp, p,
        thrust::raw_pointer_cast(probs_sorted.data()), labels,
        thrust::raw_pointer_cast(labels_sorted.data()), n));
    const float* k = thrust::raw_pointer_cast(probs_sorted.data());
    const float* y = thrust::raw_pointer_cast(labels_sorted.data());
    thrust::device_vector<int64_t> start(n), end(n), neg(n);
    thrust::counting_iterator<int64_t> idx(0);
    thrust::transform(pol, idx, idx + n, start.begin(), GroupStart{k});
    thrust::inclusive_scan(pol, start.begin(), start.end(), start.begin(),
                           thrust::maximum<int64_t>());
    thrust::transform(pol, idx, idx + n, end.begin(), GroupEnd{k, n});
    thrust::inclusive_scan(pol, end.rbegin(), end.rend(), end.rbegin(),
                           thrust::minimum<int64_t>());
    thrust::transform(pol, idx, idx + n, neg.begin(), Negative{y});
    thrust::inclusive_scan(pol, neg.begin(), neg.end(), neg.begin());
    const int64_t negatives = neg.back();
    const int64_t positives = n - negatives;
    r.positives = static_cast<double>(positives);
    const double credit = thrust::transform_reduce(
        pol, idx, idx + n,
        PositiveCredit{y, thrust::raw_pointer_cast(neg.data()),
                       thrust::raw_pointer_cast(start.data()), thrust::raw_pointer_cast(end.data())},
        0.0, thrust::plus<double>());
    r.auc = (positives == 0 || negatives == 0)
                ? std::numeric_limits<double>::quiet_NaN()
                : credit / (static_cast<double>(positives) * static_cast<double>(negatives));
  } catch (const thrust::system_error& e) {
    cudaSetDevice(prev);
    fail("GPU evaluation: ", e.what());
  }
  DLREC_CUDA_CHECK(cudaSetDevice(prev));
  return r;
}

}  // namespace dlrec::train
