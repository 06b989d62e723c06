// Tensor: a dense, contiguous, row-major n-d array on one device.
//
// Tensors share their storage on copy (like a shared_ptr); clone() makes a deep copy. Shapes
// are int64 extents. The element types the system uses are listed in DType.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/error.h"

namespace dlrec {

enum class DType { F32, BF16, F16, I32, I64, U8 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <>
struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <>
struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <>
struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, Shape shape, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return numel() * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() const { return storage_.get(); }
  template <class T>
  T* data() const {
    DLREC_CHECK(dtype_of<T>::value == dtype_, "tensor holds ", dtype_name(dtype_),
                ", accessed as ", dtype_name(dtype_of<T>::value));
    return static_cast<T*>(storage_.get());
  }

  Tensor to(Device device) const;  // copy to another device (shares if already there)
  Tensor clone() const;
  Tensor reshape(Shape shape) const;  // same storage, new shape with equal numel
  void zero_();
  void copy_from(const Tensor& src);  // same shape and dtype, any devices
  template <class T>
  std::vector<T> to_vector() const;

 private:
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_;
  std::shared_ptr<void> storage_;
};

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& v, Shape shape, Device device) {
  DLREC_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "from_vector: ", v.size(),
              " values for shape ", shape_str(shape));
  Tensor t = empty(std::move(shape), dtype_of<T>::value, device);
  copy_bytes(t.raw(), device, v.data(), Device::cpu(), v.size() * sizeof(T));
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  DLREC_CHECK(dtype_of<T>::value == dtype_, "to_vector: dtype mismatch");
  std::vector<T> v(numel());
  copy_bytes(v.data(), Device::cpu(), raw(), device_, v.size() * sizeof(T));
  return v;
}

}  // namespace dlrec
