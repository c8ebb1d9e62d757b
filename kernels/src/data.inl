// launch.hpp's bound-data calls (data.hpp), written once for both builds (common.hpp says how);
// included after the build's for_n.
#include "common.hpp"

#include <skyforge/kernels/data.hpp>

namespace skyforge::kernels {

void gather_rows(const float* x, const int32_t* y, const uint64_t* idx, size_t rows, size_t width, float* out,
                 int32_t* labels, Stream s) {
  constexpr const char* what = "gather_rows";
  if (rows == 0) return;
  impl::require(x && idx && out, what, "x, idx and out are required");
  impl::require(!y == !labels, what, "y and labels go together");
  if (width) for_n(s, rows * width, GatherRows{x, idx, out, width}, what);
  if (y) for_n(s, rows, GatherLabels{y, idx, labels}, what);
}

void transpose(const float* src, size_t rows, size_t cols, float* dst, Stream s) {
  if (rows == 0 || cols == 0) return;
  impl::require(src && dst && src != dst, "transpose", "src and dst are required and distinct");
  for_n(s, rows * cols, Transpose{src, dst, rows, cols}, "transpose");
}

void fill(double* p, size_t n, double value, Stream s) {
  if (n) for_n(s, n, AddOrSet{p, nullptr, value}, "fill");
}

void accumulate(double* acc, const double* x, size_t n, Stream s) {
  if (n == 0) return;
  impl::require(x != nullptr, "accumulate", "x is null");
  for_n(s, n, AddOrSet{acc, x, 0.0}, "accumulate");
}

void copy_block(const float* src, size_t src_stride, float* dst, size_t dst_stride, size_t rows, size_t width,
                bool add, Stream s) {
  constexpr const char* what = "copy_block";
  if (rows == 0 || width == 0) return;
  impl::require(src && dst, what, "src and dst are required");
  impl::require(src_stride >= width && dst_stride >= width, what, "a stride must be at least the width");
  for_n(s, rows * width, CopyBlock{src, dst, src_stride, dst_stride, width, add}, what);
}

}  // namespace skyforge::kernels
