// Checks of row-wise quantized embedding records (row_quant.h).
#include "dlrec/nn/row_quant.h"

#include <cmath>

#include "dlrec/core/error.h"

namespace dlrec::nn {

void check_row_quant(const RowQuantRows& t, const std::string& what) {
  if (t.bits != 8 && t.bits != 4) fail(what, ": bits must be 8 or 4, got ", t.bits);
  if (t.rows < 0 || t.dim <= 0) fail(what, ": bad shape [", t.rows, ", ", t.dim, "]");
  const int64_t want = t.rows * t.row_bytes();
  if (static_cast<int64_t>(t.codes.size()) != want)
    fail(what, ": holds ", t.codes.size(), " code bytes, [", t.rows, ", ", t.dim, "] at ", t.bits,
         " bits needs ", want);
  if (static_cast<int64_t>(t.scale.size()) != t.rows ||
      static_cast<int64_t>(t.bias.size()) != t.rows)
    fail(what, ": holds ", t.scale.size(), " scales and ", t.bias.size(), " biases for ", t.rows,
         " rows");
  for (int64_t r = 0; r < t.rows; ++r) {
    if (!(std::isfinite(t.scale[r]) && t.scale[r] >= 0))
      fail(what, ": row ", r, "'s scale is ", t.scale[r], " (a scale is finite and >= 0)");
    if (!std::isfinite(t.bias[r]))
      fail(what, ": row ", r, "'s bias is ", t.bias[r], " (a bias is finite)");
  }
  if (t.bits == 4 && t.dim % 2)
    for (int64_t r = 0; r < t.rows; ++r)
      if (t.codes[r * t.row_bytes() + t.row_bytes() - 1] >> 4)
        fail(what, ": row ", r, "'s last byte has a non-zero unused high nibble (odd dim ", t.dim,
             ")");
}

}  // namespace dlrec::nn
