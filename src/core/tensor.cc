#include "dlrec/core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace dlrec {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string Device::str() const {
  return is_cuda() ? "cuda:" + std::to_string(index) : "cpu";
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda" || s == "gpu") return cuda(0);
  for (const char* p : {"cuda:", "gpu:"}) {
    size_t n = std::strlen(p);
    if (s.compare(0, n, p) == 0 && s.size() > n &&
        s.find_first_not_of("0123456789", n) == std::string::npos)
      return cuda(std::atoi(s.c_str() + n));
  }
  fail("unknown device '", s, "' (expected cpu, cuda or cuda:N)");
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (auto d : shape) DLREC_CHECK(d >= 0, "negative extent in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = allocate(device, std::max<size_t>(t.nbytes(), 1));
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor t = empty(shape_, dtype_, device);
  copy_bytes(t.raw(), device, raw(), device_, nbytes());
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  copy_bytes(t.raw(), device_, raw(), device_, nbytes());
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  DLREC_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_), " to ",
              shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  DLREC_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from: ", shape_str(src.shape_),
              " ", dtype_name(src.dtype_), " into ", shape_str(shape_), " ", dtype_name(dtype_));
  copy_bytes(raw(), device_, src.raw(), src.device_, nbytes());
}

}  // namespace dlrec
