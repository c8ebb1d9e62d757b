// im2col / col2im and global average pooling of the host build (window.hpp) against plain
// loops written from their definitions (docs/kernels.md).
#include "reference.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sk = skyforge::kernels;

namespace {

// TensorFlow's window rule: 'same' pads (total / 2) in front, 'valid' nothing.
sk::WindowShape shape(size_t batch, uint32_t H, uint32_t W, uint32_t C, uint32_t kh, uint32_t kw, uint32_t sh,
                      uint32_t sw, bool same) {
  sk::WindowShape g;
  g.batch = batch, g.H = H, g.W = W, g.C = C, g.kh = kh, g.kw = kw, g.sh = sh, g.sw = sw;
  auto axis = [&](uint32_t in, uint32_t k, uint32_t s, uint32_t& out, uint32_t& pad) {
    if (same) {
      out = (in + s - 1) / s;
      const int64_t total = int64_t{out - 1} * s + k - in;
      pad = static_cast<uint32_t>(std::max<int64_t>(total, 0) / 2);
    } else {
      out = (in - k) / s + 1;
      pad = 0;
    }
  };
  axis(H, kh, sh, g.Ho, g.pt);
  axis(W, kw, sw, g.Wo, g.pl);
  return g;
}

const sk::WindowShape kShapes[] = {shape(2, 7, 6, 3, 3, 3, 1, 1, true), shape(3, 9, 8, 2, 4, 3, 2, 2, true),
                                   shape(2, 10, 10, 4, 6, 6, 2, 2, false), shape(1, 5, 7, 1, 2, 5, 3, 1, true)};

// The value im2col puts at col[pos, (ky, kx, c)], straight from the definition.
double x_at(const std::vector<float>& x, const sk::WindowShape& g, size_t n, uint32_t oy, uint32_t ox, uint32_t ky,
            uint32_t kx, uint32_t c) {
  const int64_t y = int64_t{oy} * g.sh - g.pt + ky, xx = int64_t{ox} * g.sw - g.pl + kx;
  if (y < 0 || xx < 0 || y >= g.H || xx >= g.W) return 0;
  return x[((n * g.H + y) * g.W + xx) * g.C + c];
}

// Calls f(i, n, oy, ox, ky, kx, c) for every col entry i, in col order.
template <class F>
void each_col(const sk::WindowShape& g, F&& f) {
  size_t i = 0;
  for (size_t n = 0; n < g.batch; ++n)
    for (uint32_t oy = 0; oy < g.Ho; ++oy)
      for (uint32_t ox = 0; ox < g.Wo; ++ox)
        for (uint32_t ky = 0; ky < g.kh; ++ky)
          for (uint32_t kx = 0; kx < g.kw; ++kx)
            for (uint32_t c = 0; c < g.C; ++c) f(i++, n, oy, ox, ky, kx, c);
}

}  // namespace

TEST(Window, Im2ColMatchesDefinition) {
  for (const auto& g : kShapes) {
    const auto x = kref::randn(g.batch * g.H * g.W * g.C, 21);
    std::vector<float> col(g.positions() * g.col_width(), -1.f);
    sk::im2col(x.data(), col.data(), g);
    each_col(g, [&](size_t i, size_t n, uint32_t oy, uint32_t ox, uint32_t ky, uint32_t kx, uint32_t c) {
      ASSERT_EQ(col[i], x_at(x, g, n, oy, ox, ky, kx, c)) << i;
    });
  }
}

// col2im is the adjoint of im2col: <im2col(x), c> = <x, col2im(c)>, and equals a scatter-add
// written from the definition.
TEST(Window, Col2ImIsTheAdjointOfIm2Col) {
  for (const auto& g : kShapes) {
    const size_t nx = g.batch * g.H * g.W * g.C, nc = g.positions() * g.col_width();
    const auto x = kref::randn(nx, 22), c = kref::randn(nc, 23);
    std::vector<float> col(nc), dx(nx, 7.f);
    sk::im2col(x.data(), col.data(), g);
    sk::col2im(c.data(), dx.data(), g);
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < nc; ++i) lhs += double{col[i]} * c[i];
    for (size_t i = 0; i < nx; ++i) rhs += double{x[i]} * dx[i];
    EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::fabs(lhs)));
    std::vector<double> ref(nx, 0.0);
    each_col(g, [&](size_t i, size_t n, uint32_t oy, uint32_t ox, uint32_t ky, uint32_t kx, uint32_t ch) {
      const int64_t y = int64_t{oy} * g.sh - g.pt + ky, xx = int64_t{ox} * g.sw - g.pl + kx;
      if (y >= 0 && xx >= 0 && y < g.H && xx < g.W) ref[((n * g.H + y) * g.W + xx) * g.C + ch] += c[i];
    });
    for (size_t j = 0; j < nx; ++j) ASSERT_NEAR(dx[j], ref[j], 1e-5 * (1 + std::fabs(ref[j]))) << j;
  }
}

// The kernel gradient of conv2d from its definition, in double: dw[(ky, kx, c), f] = sum over
// the col entries (n, oy, ox, ky, kx, c) of x under them times dy[n, oy, ox, f].
std::vector<double> conv_filter_grad_ref(const std::vector<float>& x, const std::vector<float>& dy,
                                         const sk::WindowShape& g, size_t filters) {
  const size_t kkc = g.col_width();
  std::vector<double> ref(kkc * filters, 0.0);
  each_col(g, [&](size_t i, size_t n, uint32_t oy, uint32_t ox, uint32_t ky, uint32_t kx, uint32_t c) {
    const double v = x_at(x, g, n, oy, ox, ky, kx, c);
    const size_t pos = i / kkc, k = i % kkc;
    for (size_t f = 0; f < filters; ++f) ref[k * filters + f] += v * dy[pos * filters + f];
  });
  return ref;
}

std::vector<float> run_conv_filter_grad(const std::vector<float>& x, const std::vector<float>& dy,
                                        const sk::WindowShape& g, size_t filters) {
  std::vector<double> ws(sk::conv_filter_grad_workspace(g, filters), -1.0);
  std::vector<float> dw(g.col_width() * filters, 7.f);
  sk::conv_filter_grad(x.data(), dy.data(), g, filters, dw.data(), ws.data());
  return dw;
}

// The thin first layer of the seed convnet (28x28x1, 3x3, 'same'), and windows with strides,
// padding and several channels: every entry is the double-precision sum rounded to float.
TEST(Window, ConvFilterGradMatchesDefinition) {
  std::vector<sk::WindowShape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back(shape(40, 28, 28, 1, 3, 3, 1, 1, true));  // 31,360 positions: several reduce stages
  for (const auto& g : shapes)
    for (size_t filters : {1, 5, 12}) {
      const auto x = kref::randn(g.batch * g.H * g.W * g.C, 31), dy = kref::randn(g.positions() * filters, 32);
      const auto dw = run_conv_filter_grad(x, dy, g, filters);
      const auto ref = conv_filter_grad_ref(x, dy, g, filters);
      for (size_t i = 0; i < dw.size(); ++i)
        ASSERT_NEAR(dw[i], ref[i], 1e-6 * (1 + std::fabs(ref[i]))) << "window " << g.H << "x" << g.W << "x" << g.C
                                                                    << ", filters " << filters << ", entry " << i;
    }
}

// The split depends on the shape only: one thread or several give the same bits.
TEST(Window, ConvFilterGradIsTheSameAtAnyThreadCount) {
  const auto g = shape(16, 28, 28, 1, 3, 3, 1, 1, true);
  const size_t filters = 12;
  const auto x = kref::randn(g.batch * g.H * g.W * g.C, 33), dy = kref::randn(g.positions() * filters, 34);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto a = run_conv_filter_grad(x, dy, g, filters);
  omp_set_num_threads(std::max(2, before));
  const auto b = run_conv_filter_grad(x, dy, g, filters);
  omp_set_num_threads(before);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// No position: a zero gradient. No workspace, no filters, too many elements or a bad window:
// refused before anything runs.
TEST(Window, ConvFilterGradEdges) {
  auto g = shape(0, 5, 5, 2, 3, 3, 1, 1, true);
  const std::vector<float> none;
  EXPECT_EQ(run_conv_filter_grad(none, none, g, 3), std::vector<float>(g.col_width() * 3, 0.f));
  g.batch = 1;
  std::vector<float> x(g.H * g.W * g.C), dy(g.positions() * 3), dw(g.col_width() * 3);
  EXPECT_THROW(sk::conv_filter_grad(x.data(), dy.data(), g, 3, dw.data(), nullptr), std::invalid_argument);
  std::vector<double> ws(sk::conv_filter_grad_workspace(g, 3));
  EXPECT_THROW(sk::conv_filter_grad(x.data(), dy.data(), g, 0, dw.data(), ws.data()), std::invalid_argument);
  auto big = g;
  big.batch = size_t{1} << 31;  // 2^31 x 25 positions: beyond its 32-bit indexing (refused before any read)
  EXPECT_THROW(sk::conv_filter_grad(x.data(), dy.data(), big, 3, dw.data(), ws.data()), std::invalid_argument);
  g.sw = 0;
  EXPECT_THROW(sk::conv_filter_grad(x.data(), dy.data(), g, 3, dw.data(), ws.data()), std::invalid_argument);
}

// Which windows are thin (the engine's rule for its own kernel gradient).
TEST(Window, ThinWindowsReadAtMost32ValuesPerPosition) {
  EXPECT_TRUE(sk::thin_window(shape(1, 28, 28, 1, 3, 3, 1, 1, true)));   // the seed convnet's first layer
  EXPECT_TRUE(sk::thin_window(shape(1, 32, 32, 3, 3, 3, 1, 1, true)));   // 3x3 over RGB: 27
  EXPECT_FALSE(sk::thin_window(shape(1, 28, 28, 12, 6, 6, 2, 2, true)));  // its second: 432
  EXPECT_FALSE(sk::thin_window(shape(1, 32, 32, 4, 3, 3, 1, 1, true)));  // 36
}

TEST(Window, GlobalAveragePooling) {
  const size_t batch = 3, hw = 20, C = 5;
  const auto x = kref::randn(batch * hw * C, 24), dy = kref::randn(batch * C, 25);
  std::vector<float> y(batch * C), dx(batch * hw * C);
  sk::global_avg_pool_forward(x.data(), y.data(), batch, hw, C);
  sk::global_avg_pool_backward(dy.data(), dx.data(), batch, hw, C);
  for (size_t n = 0; n < batch; ++n)
    for (size_t c = 0; c < C; ++c) {
      double s = 0;
      for (size_t p = 0; p < hw; ++p) s += x[(n * hw + p) * C + c];
      EXPECT_NEAR(y[n * C + c], s / hw, 1e-6);
      for (size_t p = 0; p < hw; ++p) ASSERT_EQ(dx[(n * hw + p) * C + c], dy[n * C + c] * (1.f / hw));
    }
}

TEST(Window, BadGeometryThrowsBeforeRunning) {
  sk::WindowShape g = kShapes[0];
  g.sh = 0;
  std::vector<float> x(1), col(1);
  EXPECT_THROW(sk::im2col(x.data(), col.data(), g), std::invalid_argument);
  EXPECT_THROW(sk::global_avg_pool_forward(x.data(), col.data(), 1, 0, 1), std::invalid_argument);
}

// Max pooling against the definition: the first maximum in window order among the positions
// inside the input, and the backward as a scatter of dy onto those positions in output order.
// Values are rounded to halves so that windows hold ties.
TEST(Window, MaxPoolMatchesDefinition) {
  for (const auto& g : {shape(2, 6, 6, 3, 2, 2, 2, 2, false), shape(2, 7, 5, 2, 3, 3, 2, 2, true),
                        shape(1, 5, 6, 2, 2, 3, 1, 1, true)}) {
    auto x = kref::randn(g.batch * g.H * g.W * g.C, 26);
    for (float& v : x) v = std::round(v * 2.f) / 2.f;
    const size_t no = g.positions() * g.C, per = size_t{g.H} * g.W * g.C;
    std::vector<float> y(no), dx(x.size(), 5.f);
    std::vector<int32_t> arg(no);
    sk::max_pool_forward(x.data(), y.data(), arg.data(), g);
    std::vector<float> ref_dx(x.size(), 0.f);
    const auto dy = kref::randn(no, 27);
    for (size_t n = 0; n < g.batch; ++n)
      for (uint32_t oy = 0; oy < g.Ho; ++oy)
        for (uint32_t ox = 0; ox < g.Wo; ++ox)
          for (uint32_t c = 0; c < g.C; ++c) {
            float best = 0.f;
            int64_t at = -1;
            for (uint32_t ky = 0; ky < g.kh; ++ky)
              for (uint32_t kx = 0; kx < g.kw; ++kx) {
                const int64_t yy = int64_t{oy} * g.sh + ky - g.pt, xx = int64_t{ox} * g.sw + kx - g.pl;
                if (yy < 0 || xx < 0 || yy >= g.H || xx >= g.W) continue;
                const int64_t idx = (yy * g.W + xx) * g.C + c;
                if (at < 0 || x[n * per + idx] > best) best = x[n * per + idx], at = idx;
              }
            const size_t o = ((n * g.Ho + oy) * g.Wo + ox) * g.C + c;
            ASSERT_EQ(y[o], best) << o;
            ASSERT_EQ(arg[o], at) << o;
            ref_dx[n * per + at] += dy[o];
          }
    sk::max_pool_backward(dy.data(), arg.data(), dx.data(), g);
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx[i], ref_dx[i]) << i;
  }
}
