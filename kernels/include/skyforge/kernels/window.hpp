// Windows over NHWC images (docs/kernels.md): im2col and its adjoint col2im for conv2d as a GEMM
// (the cpu backend's layout), and global average pooling. The geometry is the layer schema's
// (skyforge/layer_schema.hpp: output size and leading padding per axis).
#pragma once

#include "hd.hpp"
#include "reduce.hpp"

#include <cstddef>
#include <cstdint>

namespace skyforge::kernels {

// A window of kh x kw moved by (sh, sw) over [batch, H, W, C], padded by (pt, pl) in front,
// giving Ho x Wo positions. A col row is one position's window, (ky, kx, c) fastest last:
// col is [batch * Ho * Wo, kh * kw * C].
struct WindowShape {
  size_t batch = 0;
  uint32_t H = 0, W = 0, C = 0, kh = 1, kw = 1, sh = 1, sw = 1, pt = 0, pl = 0, Ho = 0, Wo = 0;
  SF_HD size_t col_width() const { return size_t{kh} * kw * C; }
  SF_HD size_t positions() const { return batch * Ho * Wo; }
};

// Element i of an NHWC tensor [batch, h, w, C]: its sample, row, column and channel.
struct Nhwc {
  size_t n;
  uint32_t y, x, c;
};
SF_HD inline Nhwc nhwc_of(size_t i, uint32_t h, uint32_t w, uint32_t C) {
  return Nhwc{i / (size_t{C} * w * h), static_cast<uint32_t>(i / C / w % h), static_cast<uint32_t>(i / C % w),
              static_cast<uint32_t>(i % C)};
}

// The output positions whose windows hold input element e: oy in [oy0, oy1] (and < Ho), those
// with oy * sh - pt <= y <= oy * sh - pt + kh - 1; ox likewise.
struct WindowsOver {
  int64_t oy0, oy1, ox0, ox1;
  SF_HD WindowsOver(const WindowShape& g, const Nhwc& e) {
    const int64_t ty = int64_t{e.y} + g.pt, tx = int64_t{e.x} + g.pl;
    oy0 = ty - g.kh + 1 <= 0 ? 0 : (ty - g.kh + 1 + g.sh - 1) / g.sh, oy1 = ty / g.sh;
    ox0 = tx - g.kw + 1 <= 0 ? 0 : (tx - g.kw + 1 + g.sw - 1) / g.sw, ox1 = tx / g.sw;
  }
};

// Element i of col: the input value under it, or 0 in the padding.
struct Im2ColElem {
  const float* x;
  float* col;
  WindowShape g;
  SF_HD void operator()(size_t i) const {
    const size_t kkc = g.col_width();
    const size_t pos = i / kkc, k = i % kkc;
    const uint32_t c = static_cast<uint32_t>(k % g.C), kx = static_cast<uint32_t>(k / g.C % g.kw),
                   ky = static_cast<uint32_t>(k / g.C / g.kw);
    const uint32_t ox = static_cast<uint32_t>(pos % g.Wo), oy = static_cast<uint32_t>(pos / g.Wo % g.Ho);
    const size_t n = pos / (size_t{g.Wo} * g.Ho);
    const int64_t y = int64_t{oy} * g.sh - g.pt + ky, xx = int64_t{ox} * g.sw - g.pl + kx;
    col[i] = y < 0 || xx < 0 || y >= g.H || xx >= g.W ? 0.f : x[((n * g.H + y) * g.W + xx) * g.C + c];
  }
};

// Element i of dx: the sum of the col entries that read it (the adjoint of im2col), gathered in
// (ky, kx) order so that no two threads write one element.
struct Col2ImElem {
  const float* col;
  float* dx;
  WindowShape g;
  SF_HD void operator()(size_t i) const {
    const Nhwc e = nhwc_of(i, g.H, g.W, g.C);
    const uint32_t c = e.c, x = e.x, y = e.y;
    const size_t n = e.n, kkc = g.col_width();
    float s = 0.f;
    for (uint32_t ky = 0; ky < g.kh; ++ky) {
      const int64_t ty = int64_t{y} + g.pt - ky;
      if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.Ho) continue;
      for (uint32_t kx = 0; kx < g.kw; ++kx) {
        const int64_t tx = int64_t{x} + g.pl - kx;
        if (tx < 0 || tx % g.sw != 0 || tx / g.sw >= g.Wo) continue;
        const size_t pos = (n * g.Ho + static_cast<size_t>(ty / g.sh)) * g.Wo + static_cast<size_t>(tx / g.sw);
        s += col[pos * kkc + (size_t{ky} * g.kw + kx) * g.C + c];
      }
    }
    dx[i] = s;
  }
};

// conv2d's kernel gradient as a column reduction (reduce.hpp) of a virtual [positions, kh * kw *
// C * F] matrix whose row p, column ((ky, kx, c), f) is x under (ky, kx, c) at position p times
// dy[p, f]: each product exact and each sum in the accumulator A (reduce.hpp, sums.hpp), split by
// shape only, so it is deterministic on every backend, thread count and GPU. Stage 1: partial k
// of column col adds rows k, k + K, k + 2K, ... in that order (ColumnPartials' rule); a
// position's (n, oy, ox) is carried from row to row by adding K's, so the loop divides nothing,
// and indexes in 32 bits (x and dy hold fewer than 2^31 elements; K <= 2^17, so r stays below
// 2^32 past the last row). The later stages are reduce.hpp's.
template <class A>
struct ConvFilterPartials {
  const float* x;
  const float* dy;
  WindowShape g;
  size_t filters, cols, K;  // cols = g.col_width() * filters
  double* part;
  SF_HD void operator()(size_t i) const {
    const size_t k = i / cols, col = i % cols;
    const uint32_t f = static_cast<uint32_t>(col % filters), kkc = static_cast<uint32_t>(col / filters);
    const uint32_t c = kkc % g.C, kx = kkc / g.C % g.kw, ky = kkc / g.C / g.kw;
    const uint32_t plane = g.Ho * g.Wo, rows = static_cast<uint32_t>(g.positions()), F = static_cast<uint32_t>(filters);
    const uint32_t step = static_cast<uint32_t>(K), WC = g.W * g.C, HWC = g.H * WC;
    uint32_t n = static_cast<uint32_t>(k) / plane, oy = static_cast<uint32_t>(k) / g.Wo % g.Ho,
             ox = static_cast<uint32_t>(k) % g.Wo;
    const uint32_t dn = step / plane, doy = step / g.Wo % g.Ho, dox = step % g.Wo;
    // kRows rows' loads are issued before their products are added (in row order), so that a
    // GPU thread waits for kRows loads at once, not one after another. An x in the padding, and
    // a row past the last, read as 0: for a finite dy, adding a zero product leaves the sum as
    // skipping it would (the sum is never -0; an infinite dy makes NaN, as im2col + GEMM does).
    constexpr int kRows = 8;
    A acc;
    for (uint32_t r = static_cast<uint32_t>(k); r < rows;) {
      float xv[kRows], dv[kRows];
      for (int j = 0; j < kRows; ++j, r += step) {
        // y or x before the image wraps to a large unsigned value: outside, as one past its end is.
        const uint32_t y = oy * g.sh + ky - g.pt, xx = ox * g.sw + kx - g.pl;
        const bool live = r < rows, inside = live && y < g.H && xx < g.W;
        xv[j] = inside ? x[n * HWC + y * WC + xx * g.C + c] : 0.f;
        dv[j] = live ? dy[r * F + f] : 0.f;
        ox += dox;  // (n, oy, ox) += (dn, doy, dox), with carries
        if (ox >= g.Wo) ox -= g.Wo, ++oy;
        oy += doy;
        if (oy >= g.Ho) oy -= g.Ho, ++n;
        n += dn;
      }
      for (int j = 0; j < kRows; ++j) acc.add_product(xv[j], dv[j]);
    }
    acc.store(part + k * cols + col);
  }
};

// Doubles of workspace conv_filter_grad needs (launch.hpp): reduce_workspace's for the virtual
// matrix. Never decreasing in the batch.
SF_HD inline size_t conv_filter_grad_workspace(const WindowShape& g, size_t filters) {
  return reduce_workspace(g.positions(), g.col_width() * filters);
}

// A window thin enough that conv_filter_grad is the engine's way to its kernel gradient, on any
// device: at most kThinWindow inputs per position (a first layer over one to three channels:
// 3x3 over RGB is 27). There each position adds into few outputs and a GEMM's reduction
// dimension is the whole batch of positions, which cuDNN's deterministic algorithms run slowly
// (docs/compute-backends.md, "Thin windows", has the figures).
inline constexpr size_t kThinWindow = 32;
SF_HD inline bool thin_window(const WindowShape& g) { return g.col_width() <= kThinWindow; }

// Element (n, c) of [batch, C]: the mean over the hw positions of [batch, hw, C], summed in float
// in position order and scaled by 1/hw, as the cpu backend does.
struct GapForwardElem {
  const float* x;
  float* y;
  size_t hw, C;
  SF_HD void operator()(size_t i) const {
    const size_t n = i / C, c = i % C;
    const float* xs = x + n * hw * C + c;
    float s = 0.f;
    for (size_t p = 0; p < hw; ++p) s += xs[p * C];
    y[i] = s * (1.f / static_cast<float>(hw));
  }
};

// Element i of [batch, hw, C]: dy[n, c] / hw.
struct GapBackwardElem {
  const float* dy;
  float* dx;
  size_t hw, C;
  SF_HD void operator()(size_t i) const {
    dx[i] = dy[i / (hw * C) * C + i % C] * (1.f / static_cast<float>(hw));
  }
};

// Max pooling, output element i of [batch, Ho, Wo, C] over the window (kh, kw) = the pool size:
// the first maximum in (ky, kx) order of the positions inside the input (padding is never
// chosen), its index within the sample ((y * W + x) * C + c) into arg: the cpu backend's rule.
struct MaxPoolForwardElem {
  const float* x;
  float* y;
  int32_t* arg;
  WindowShape g;
  SF_HD void operator()(size_t i) const {
    const Nhwc e = nhwc_of(i, g.Ho, g.Wo, g.C);
    const uint32_t c = e.c, ox = e.x, oy = e.y;
    const size_t n = e.n;
    const float* xs = x + n * g.H * g.W * g.C;
    float best = 0.f;
    int32_t at = -1;
    for (uint32_t ky = 0; ky < g.kh; ++ky) {
      const int64_t yy = int64_t{oy} * g.sh + ky - g.pt;
      if (yy < 0 || yy >= g.H) continue;
      for (uint32_t kx = 0; kx < g.kw; ++kx) {
        const int64_t xx = int64_t{ox} * g.sw + kx - g.pl;
        if (xx < 0 || xx >= g.W) continue;
        const int32_t idx = static_cast<int32_t>((yy * g.W + xx) * g.C + c);
        if (at < 0 || xs[idx] > best) best = xs[idx], at = idx;
      }
    }
    y[i] = best;
    arg[i] = at;
  }
};

// Input element i of [batch, H, W, C]: the sum of dy over the outputs whose maximum it was, in
// output order (the order in which the cpu backend adds them).
struct MaxPoolBackwardElem {
  const float* dy;
  const int32_t* arg;
  float* dx;
  WindowShape g;
  SF_HD void operator()(size_t i) const {
    const size_t per = size_t{g.H} * g.W * g.C, n = i / per, own = i % per;
    const uint32_t c = static_cast<uint32_t>(i % g.C);
    const WindowsOver w(g, nhwc_of(i, g.H, g.W, g.C));
    float s = 0.f;
    for (int64_t oy = w.oy0; oy <= w.oy1 && oy < g.Ho; ++oy)
      for (int64_t ox = w.ox0; ox <= w.ox1 && ox < g.Wo; ++ox) {
        const size_t o = ((n * g.Ho + static_cast<size_t>(oy)) * g.Wo + static_cast<size_t>(ox)) * g.C + c;
        if (arg[o] == static_cast<int32_t>(own)) s += dy[o];
      }
    dx[i] = s;
  }
};

}  // namespace skyforge::kernels
