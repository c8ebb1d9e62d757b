// launch.hpp's window calls (im2col, col2im, conv2d's filter gradient, global, max and average
// pooling), written once for both builds (common.hpp says how); included after the build's for_n.
#include "common.hpp"

#include <skyforge/kernels/avg_pool.hpp>
#include <skyforge/kernels/window.hpp>

namespace skyforge::kernels {

namespace impl {
inline void check_window(const WindowShape& g, const char* what) {
  require(g.H && g.W && g.C && g.kh && g.kw && g.sh && g.sw && g.Ho && g.Wo, what,
          "every dimension and stride must be at least 1");
}
}  // namespace impl

void im2col(const float* x, float* col, const WindowShape& g, Stream s) {
  if (g.batch == 0) return;
  impl::check_window(g, "im2col");
  for_n(s, g.positions() * g.col_width(), Im2ColElem{x, col, g}, "im2col");
}

void col2im(const float* col, float* dx, const WindowShape& g, Stream s) {
  if (g.batch == 0) return;
  impl::check_window(g, "col2im");
  for_n(s, g.batch * g.H * g.W * g.C, Col2ImElem{col, dx, g}, "col2im");
}

void conv_filter_grad(const float* x, const float* dy, const WindowShape& g, size_t filters, float* dw, double* ws,
                      Stream s) {
  constexpr const char* what = "conv_filter_grad";
  impl::check_window(g, what);
  impl::require(filters > 0, what, "filters must be at least 1");
  constexpr size_t kLimit = size_t{1} << 31;  // its first stage indexes in 32 bits
  impl::require(size_t{g.H} * g.W * g.C < kLimit && size_t{g.Ho} * g.Wo * filters < kLimit &&
                    g.batch * g.H * g.W * g.C < kLimit && g.positions() * filters < kLimit,
                what, "x and dy must each hold fewer than 2^31 elements");
  const size_t cols = g.col_width() * filters;
  const size_t K = reduce_split(g.positions(), cols);  // at least 1: with no position, dw is 0
  with_sum(s.reduction, [&](auto sum) {
    using A = decltype(sum);
    impl::reduce_stages<1, A>(s, cols, K, ConvFilterPartials<A>{x, dy, g, filters, cols, K, ws}, StoreFloat{dw}, ws,
                              what);
  });
}

void global_avg_pool_forward(const float* x, float* y, size_t batch, size_t hw, size_t C, Stream s) {
  impl::require(hw > 0, "global_avg_pool_forward", "hw must be at least 1");
  for_n(s, batch * C, GapForwardElem{x, y, hw, C}, "global_avg_pool_forward");
}

void global_avg_pool_backward(const float* dy, float* dx, size_t batch, size_t hw, size_t C, Stream s) {
  impl::require(hw > 0, "global_avg_pool_backward", "hw must be at least 1");
  for_n(s, batch * hw * C, GapBackwardElem{dy, dx, hw, C}, "global_avg_pool_backward");
}

void max_pool_forward(const float* x, float* y, int32_t* arg, const WindowShape& g, Stream s) {
  if (g.batch == 0) return;
  impl::check_window(g, "max_pool_forward");
  impl::require(size_t{g.H} * g.W * g.C < (size_t{1} << 31), "max_pool_forward", "H * W * C must be below 2^31");
  for_n(s, g.positions() * g.C, MaxPoolForwardElem{x, y, arg, g}, "max_pool_forward");
}

void max_pool_backward(const float* dy, const int32_t* arg, float* dx, const WindowShape& g, Stream s) {
  if (g.batch == 0) return;
  impl::check_window(g, "max_pool_backward");
  for_n(s, g.batch * g.H * g.W * g.C, MaxPoolBackwardElem{dy, arg, dx, g}, "max_pool_backward");
}

void avg_pool_forward(const float* x, float* y, const WindowShape& g, Stream s) {
  if (g.batch == 0) return;
  impl::check_window(g, "avg_pool_forward");
  for_n(s, g.positions() * g.C, AvgPoolForwardElem{x, y, g}, "avg_pool_forward");
}

void avg_pool_backward(const float* dy, float* dx, const WindowShape& g, Stream s) {
  if (g.batch == 0) return;
  impl::check_window(g, "avg_pool_backward");
  for_n(s, g.batch * g.H * g.W * g.C, AvgPoolBackwardElem{dy, dx, g}, "avg_pool_backward");
}

}  // namespace skyforge::kernels
