// Average pooling over NHWC images (docs/kernels.md), Keras' AveragePooling2D: each output is
// the mean of its window's positions inside the input, so with 'same' padding an edge window
// divides by the positions it covers, not by the pool size. The geometry is window.hpp's.
#pragma once

#include "hd.hpp"
#include "window.hpp"

#include <cstddef>
#include <cstdint>

namespace skyforge::kernels {

// The positions inside the input of output (oy, ox)'s window: [y0, y1) x [x0, x1).
struct AvgPoolSpan {
  int64_t y0, y1, x0, x1;
  SF_HD AvgPoolSpan(const WindowShape& g, int64_t oy, int64_t ox) {
    const int64_t ty = oy * g.sh - g.pt, tx = ox * g.sw - g.pl;
    y0 = ty < 0 ? 0 : ty, x0 = tx < 0 ? 0 : tx;
    y1 = ty + g.kh > g.H ? g.H : ty + g.kh, x1 = tx + g.kw > g.W ? g.W : tx + g.kw;
  }
  SF_HD float inv_count() const { return 1.f / static_cast<float>((y1 - y0) * (x1 - x0)); }
};

// Output element i of [batch, Ho, Wo, C]: the window's sum in (y, x) order, in float, times
// 1 / (positions inside).
struct AvgPoolForwardElem {
  const float* x;
  float* y;
  WindowShape g;
  SF_HD void operator()(size_t i) const {
    const Nhwc e = nhwc_of(i, g.Ho, g.Wo, g.C);
    const uint32_t c = e.c, ox = e.x, oy = e.y;
    const size_t n = e.n;
    const float* xs = x + n * g.H * g.W * g.C + c;
    const AvgPoolSpan w(g, oy, ox);
    float s = 0.f;
    for (int64_t yy = w.y0; yy < w.y1; ++yy)
      for (int64_t xx = w.x0; xx < w.x1; ++xx) s += xs[(yy * g.W + xx) * g.C];
    y[i] = s * w.inv_count();
  }
};

// Input element i of [batch, H, W, C]: the sum over the windows holding it of dy / (that
// window's positions inside), in output order; no two threads write one element.
struct AvgPoolBackwardElem {
  const float* dy;
  float* dx;
  WindowShape g;
  SF_HD void operator()(size_t i) const {
    const Nhwc e = nhwc_of(i, g.H, g.W, g.C);
    const WindowsOver w(g, e);
    const size_t n = e.n;
    const uint32_t c = e.c;
    float s = 0.f;
    for (int64_t oy = w.oy0; oy <= w.oy1 && oy < g.Ho; ++oy)
      for (int64_t ox = w.ox0; ox <= w.ox1 && ox < g.Wo; ++ox) {
        const size_t o = ((n * g.Ho + static_cast<size_t>(oy)) * g.Wo + static_cast<size_t>(ox)) * g.C + c;
        s += dy[o] * AvgPoolSpan(g, oy, ox).inv_count();
      }
    dx[i] = s;
  }
};

}  // namespace skyforge::kernels
