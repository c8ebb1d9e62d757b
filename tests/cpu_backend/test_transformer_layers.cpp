// The cpu backend's layers of transformers and their neighbours: gelu / tanh / sigmoid (layers
// and dense/conv2d activations), average_pooling2d, global_average_pooling1d,
// layer_normalization, embedding, position_embedding and multi_head_attention. Forwards against
// double-precision references written here from Keras' formulas, gradients against finite
// differences (gradcheck.hpp), attention dropout's masks, bit-identical results on 1 and 2
// threads, and small models that train through the engine.
#include "gradcheck.hpp"

#include <skyforge/kernels/philox.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

using namespace skyforge::cpu;
using namespace cpu_test;

namespace {

std::unique_ptr<Layer> make(const LayerSpec& s, const Shape& in, size_t index = 0) {
  return make_layer(s, in, index, 1, 0);
}

// y = layer(x) in inference mode, with parameters p.
std::vector<float> run(Layer& l, const std::vector<float>& x, uint32_t batch, std::vector<float>& p,
                       bool training = false) {
  std::vector<float> g(p.size()), y(batch * numel(l.out_shape));
  l.bind(p.data(), g.data());
  l.reserve(batch);
  l.forward(x.data(), y.data(), batch, training);
  return y;
}

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
}

double gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

// ---- activations ---------------------------------------------------------------------------
struct ActivationCase {
  LayerSpec spec;
  double (*f)(double);
};

TEST(Activations, MatchTheirFormulas) {
  const ActivationCase cases[] = {{layer("gelu"), gelu},
                                  {layer("gelu", {{"approximate", "true"}}), gelu_tanh},
                                  {layer("tanh"), [](double x) { return std::tanh(x); }},
                                  {layer("sigmoid"), sigmoid}};
  std::vector<float> x;
  for (int i = -120; i <= 120; ++i) x.push_back(static_cast<float>(i) / 10.f);  // [-12, 12]
  for (const auto& c : cases) {
    auto l = make(c.spec, {static_cast<uint32_t>(x.size())});
    std::vector<float> p;
    std::vector<double> want;
    for (float v : x) want.push_back(c.f(v));
    SCOPED_TRACE(c.spec.type);
    expect_near(run(*l, x, 1, p), want, 2e-6);
  }
}

TEST(Activations, GradCheck) {
  for (const LayerSpec& s : {layer("gelu"), layer("gelu", {{"approximate", "true"}}), layer("tanh"), layer("sigmoid")}) {
    SCOPED_TRACE(s.type);
    auto l = make(s, {3, 5});
    check_layer(*l, 2, uniform(30, 30, -3, 3), true);
  }
}

// Dense on (sequence, features) acts on the last axis, each activation applied after the bias.
TEST(Activations, DenseOnSequencesWithEachActivation) {
  for (const char* act : {"gelu", "tanh", "sigmoid"}) {
    SCOPED_TRACE(act);
    auto l = make(layer("dense", {{"units", "4"}, {"activation", act}}), {3, 5});
    EXPECT_EQ(l->out_shape, (Shape{3, 4}));
    check_layer(*l, 2, uniform(30, 31, -1, 1), true);
    // Against the linear dense followed by the formula.
    auto lin = make(layer("dense", {{"units", "4"}}), {3, 5});
    auto p = uniform(l->param_size(), 32, -0.5f, 0.5f);
    const auto x = uniform(30, 33, -2, 2);
    const auto z = run(*lin, x, 2, p);
    std::vector<double> want;
    for (float v : z)
      want.push_back(act[0] == 'g' ? gelu(v) : act[0] == 't' ? std::tanh(static_cast<double>(v)) : sigmoid(v));
    expect_near(run(*l, x, 2, p), want, 2e-6);
  }
}

TEST(Activations, Conv2dGelu) {
  auto l = make(layer("conv2d", {{"filters", "3"}, {"kernel_size", "3"}, {"padding", "same"}, {"activation", "gelu"}}),
                {5, 5, 2});
  check_layer(*l, 2, uniform(100, 34, -1, 1), true);
  auto one = make(layer("conv2d", {{"filters", "3"}, {"kernel_size", "1"}, {"activation", "sigmoid"}}), {3, 3, 4});
  check_layer(*one, 2, uniform(72, 35, -1, 1), true);
}

// ---- pooling -------------------------------------------------------------------------------
// The mean over each window's positions inside the input (TensorFlow's 'same' counts no padding).
std::vector<double> average_pool_reference(const std::vector<float>& x, uint32_t B, uint32_t H, uint32_t W,
                                           uint32_t C, uint32_t p, uint32_t s, uint32_t pad, uint32_t Ho, uint32_t Wo) {
  std::vector<double> y;
  for (uint32_t n = 0; n < B; ++n)
    for (uint32_t oh = 0; oh < Ho; ++oh)
      for (uint32_t ow = 0; ow < Wo; ++ow)
        for (uint32_t c = 0; c < C; ++c) {
          double sum = 0;
          int count = 0;
          for (uint32_t i = 0; i < p; ++i)
            for (uint32_t j = 0; j < p; ++j) {
              const int h = static_cast<int>(oh * s + i) - static_cast<int>(pad);
              const int w = static_cast<int>(ow * s + j) - static_cast<int>(pad);
              if (h < 0 || w < 0 || h >= static_cast<int>(H) || w >= static_cast<int>(W)) continue;
              sum += x[((n * H + h) * W + w) * C + c];
              ++count;
            }
          y.push_back(sum / count);
        }
  return y;
}

TEST(Pooling, AveragePooling2dValid) {
  auto l = make(layer("average_pooling2d"), {5, 4, 2});
  ASSERT_EQ(l->out_shape, (Shape{2, 2, 2}));
  const auto x = uniform(2 * 40, 40, -1, 1);
  std::vector<float> p;
  expect_near(run(*l, x, 2, p), average_pool_reference(x, 2, 5, 4, 2, 2, 2, 0, 2, 2), 1e-6);
  check_layer(*l, 2, x, true);
}

TEST(Pooling, AveragePooling2dSameCountsOnlyTheInput) {
  // 3x3 windows, stride 2 over 6x6: out 3, total pad (3 - 1) * 2 + 3 - 6 = 1, none at the top.
  auto l = make(layer("average_pooling2d", {{"pool_size", "3"}, {"strides", "2"}, {"padding", "same"}}), {6, 6, 3});
  ASSERT_EQ(l->out_shape, (Shape{3, 3, 3}));
  const auto x = uniform(2 * 108, 41, -1, 1);
  std::vector<float> p;
  expect_near(run(*l, x, 2, p), average_pool_reference(x, 2, 6, 6, 3, 3, 2, 0, 3, 3), 1e-6);
  check_layer(*l, 2, x, true);
  // 5x5 same, stride 1: one leading pad row, so a corner averages 4 of its 9 positions... (3x3)
  auto k = make(layer("average_pooling2d", {{"pool_size", "3"}, {"strides", "1"}, {"padding", "same"}}), {4, 4, 1});
  std::vector<float> ones(16, 1.f);
  for (float v : run(*k, ones, 1, p)) EXPECT_FLOAT_EQ(v, 1.f);  // zeros of the padding never count
  const auto y = uniform(16, 42, -1, 1);
  expect_near(run(*k, y, 1, p), average_pool_reference(y, 1, 4, 4, 1, 3, 1, 1, 4, 4), 1e-6);
}

TEST(Pooling, GlobalAveragePooling1d) {
  auto l = make(layer("global_average_pooling1d"), {6, 4});
  ASSERT_EQ(l->out_shape, (Shape{4}));
  const auto x = uniform(2 * 24, 43, -1, 1);
  std::vector<double> want;
  for (size_t n = 0; n < 2; ++n)
    for (size_t f = 0; f < 4; ++f) {
      double s = 0;
      for (size_t t = 0; t < 6; ++t) s += x[n * 24 + t * 4 + f];
      want.push_back(s / 6);
    }
  std::vector<float> p;
  expect_near(run(*l, x, 2, p), want, 1e-6);
  check_layer(*l, 2, x, true);
}

// ---- layer_normalization -------------------------------------------------------------------
TEST(LayerNormalization, MatchesKerasFormula) {
  auto l = make(layer("layer_normalization"), {3, 8});
  ASSERT_EQ(l->param_size(), 16u);
  auto p = uniform(16, 50, -1, 1);  // gamma, beta
  const auto x = uniform(2 * 24, 51, -3, 5);
  std::vector<double> want;
  for (size_t r = 0; r < 6; ++r) {
    double m = 0, v = 0;
    for (size_t j = 0; j < 8; ++j) m += x[r * 8 + j] / 8.0;
    for (size_t j = 0; j < 8; ++j) v += (x[r * 8 + j] - m) * (x[r * 8 + j] - m) / 8.0;
    for (size_t j = 0; j < 8; ++j) want.push_back((x[r * 8 + j] - m) / std::sqrt(v + 1e-3) * p[j] + p[8 + j]);
  }
  expect_near(run(*l, x, 2, p), want, 1e-5);
}

TEST(LayerNormalization, GradCheck) {
  auto l = make(layer("layer_normalization", {{"epsilon", "0.01"}}), {4, 6});
  check_layer(*l, 2, uniform(48, 52, -2, 2), true);
  auto only_center = make(layer("layer_normalization", {{"scale", "false"}}), {5});
  EXPECT_EQ(only_center->param_size(), 5u);
  check_layer(*only_center, 3, uniform(15, 53, -2, 2), true);
  auto neither = make(layer("layer_normalization", {{"scale", "false"}, {"center", "false"}}), {2, 7});
  EXPECT_EQ(neither->param_size(), 0u);
  check_layer(*neither, 2, uniform(28, 54, -2, 2), true);
}

// ---- embedding, position_embedding ---------------------------------------------------------
TEST(Embedding, LooksUpRowsAndSumsTheirGradients) {
  auto l = make(layer("embedding", {{"input_dim", "5"}, {"output_dim", "3"}}), {4});
  ASSERT_EQ(l->out_shape, (Shape{4, 3}));
  auto p = uniform(15, 60, -1, 1);
  const std::vector<float> x = {0, 4, 2, 2, 1, 1, 1, 3};
  const auto y = run(*l, x, 2, p);
  for (size_t i = 0; i < 8; ++i)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(y[i * 3 + j], p[static_cast<size_t>(x[i]) * 3 + j]);
  // Every row's gradient (row 2 and 1 appear several times); the input gets none.
  auto c = check_layer(*l, 2, x, true, p, /*check_dx=*/false);
  EXPECT_EQ(c.params, 15u);
  std::vector<float> g(15), dy = uniform(24, 61, -1, 1), dx(8, 5.f);
  l->bind(p.data(), g.data());
  l->backward(x.data(), y.data(), dy.data(), dx.data(), 2);
  EXPECT_EQ(dx, std::vector<float>(8, 0.f));
}

TEST(Embedding, RefusesValuesThatAreNotIndices) {
  auto l = make(layer("embedding", {{"input_dim", "5"}, {"output_dim", "3"}, {"name", "tokens"}}), {2}, 3);
  std::vector<float> p(15, 0.f);
  for (float bad : {2.5f, -1.f, 5.f, std::nanf("")}) {
    const std::vector<float> x = {0, 1, 4, bad};
    const auto y = run(*l, x, 2, p);  // counted, a row of zeros: the engine refuses the step
    std::string m;
    EXPECT_EQ(l->invalid_inputs(m), 1u) << bad;
    EXPECT_EQ(std::vector<float>(y.begin() + 9, y.end()), std::vector<float>(3, 0.f));
    EXPECT_NE(m.find("layer 3 (embedding 'tokens'): sample 1 holds"), std::string::npos) << m;
    EXPECT_NE(m.find("at position 1; expected an integer index in [0, 5)"), std::string::npos) << m;
  }
}

// A replica whose batch holds a value that is not an index refuses the step, and so does its peer
// (which holds none) instead of waiting in a collective; neither updates its weights nor the
// moving statistics its forward had already moved.
TEST(Embedding, EveryReplicaRefusesAStepWithAnInvalidIndexBeforeUpdating) {
  ModelSpec m;
  m.input_shape = {2};
  m.layers = {layer("embedding", {{"input_dim", "5"}, {"output_dim", "3"}}), layer("batch_normalization"),
              layer("flatten"), layer("dense", {{"units", "4"}})};
  ThreadGroup g(2);
  std::string message[2];
  sf_status status[2] = {SF_OK, SF_OK};
  bool unchanged[2] = {false, false};
  g.run([&](uint32_t rank) {
    CpuEngine e(m, skyforge::Communicator(g.comm(rank)));
    auto weights = [&] {
      std::vector<float> w(e.param_count());
      e.get_params(w.data(), w.size());
      std::vector<std::vector<float>*> moving;
      e.layer(1).moving(moving);
      for (const auto* v : moving) w.insert(w.end(), v->begin(), v->end());
      return w;
    };
    const std::vector<float> before = weights();
    const std::vector<float> x = rank == 0 ? std::vector<float>{0, 1, 2, 3} : std::vector<float>{4, 7, 1, 0};
    const std::vector<int32_t> y = {1, 2};
    try {
      e.train_step(x.data(), y.data(), 2);
    } catch (const skyforge::Error& err) {
      status[rank] = err.status();
      message[rank] = err.what();
    }
    unchanged[rank] = weights() == before;
  });
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r], SF_ERR_INVALID) << r;
    EXPECT_TRUE(unchanged[r]) << r;
  }
  EXPECT_NE(message[1].find("sample 0 holds 7 at position 1"), std::string::npos) << message[1];
  EXPECT_NE(message[0].find("1 input value(s) of the global batch are not valid indices (on another replica)"),
            std::string::npos)
      << message[0];
}

TEST(PositionEmbedding, IsTheTableForEverySampleWithNoInputGradient) {
  auto l = make(layer("position_embedding", {{"sequence_length", "6"}}), {4, 3});
  ASSERT_EQ(l->param_size(), 18u);
  auto p = uniform(18, 62, -1, 1);
  const auto x = uniform(24, 63, -1, 1);
  const auto y = run(*l, x, 2, p);
  for (size_t n = 0; n < 2; ++n)
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(y[n * 12 + i], p[i]);
  auto c = check_layer(*l, 2, x, true, p);  // dx: 0, which the differences confirm
  EXPECT_EQ(c.params, 18u);
}

// ---- multi_head_attention ------------------------------------------------------------------
// Keras' MultiHeadAttention(x, x) in double from the layer's weights; keep(n, h, i, j) says
// whether attention weight (sample n, head h, query i, key j) survives dropout (scaled by
// 1 / (1 - rate) then).
std::vector<double> attention_reference(const std::vector<float>& x, const std::vector<float>& w, uint32_t B,
                                        uint32_t T, uint32_t D, uint32_t H, uint32_t kd, uint32_t vd, bool bias,
                                        double rate = 0,
                                        const std::function<bool(size_t, size_t, size_t, size_t)>& keep = {}) {
  size_t at = 0;
  auto take = [&](size_t n) { return at += n, w.data() + at - n; };
  const float *wq = take(D * H * kd), *bq = bias ? take(H * kd) : nullptr, *wk = take(D * H * kd),
              *bk = bias ? take(H * kd) : nullptr, *wv = take(D * H * vd), *bv = bias ? take(H * vd) : nullptr,
              *wo = take(H * vd * D), *bo = bias ? take(D) : nullptr;
  auto proj = [&](size_t n, size_t t, const float* W, const float* b, size_t width, size_t col) {
    double s = b ? b[col] : 0;
    for (size_t d = 0; d < D; ++d) s += double{x[(n * T + t) * D + d]} * W[d * width + col];
    return s;
  };
  std::vector<double> y(size_t{B} * T * D, 0);
  for (size_t n = 0; n < B; ++n) {
    std::vector<double> o(size_t{T} * H * vd, 0);
    for (size_t h = 0; h < H; ++h)
      for (size_t i = 0; i < T; ++i) {
        std::vector<double> s(T);
        double m = -1e300, z = 0;
        for (size_t j = 0; j < T; ++j) {
          for (size_t c = 0; c < kd; ++c)
            s[j] += proj(n, i, wq, bq, H * kd, h * kd + c) * proj(n, j, wk, bk, H * kd, h * kd + c);
          s[j] /= std::sqrt(static_cast<double>(kd));
          m = std::max(m, s[j]);
        }
        for (double& v : s) z += (v = std::exp(v - m));
        for (size_t j = 0; j < T; ++j) {
          double a = s[j] / z;
          if (keep) a = keep(n, h, i, j) ? a / (1 - rate) : 0;
          for (size_t c = 0; c < vd; ++c) o[i * H * vd + h * vd + c] += a * proj(n, j, wv, bv, H * vd, h * vd + c);
        }
      }
    for (size_t i = 0; i < T; ++i)
      for (size_t d = 0; d < D; ++d) {
        double s = bo ? bo[d] : 0;
        for (size_t c = 0; c < H * vd; ++c) s += o[i * H * vd + c] * wo[c * D + d];
        y[(n * T + i) * D + d] = s;
      }
  }
  return y;
}

TEST(MultiHeadAttention, MatchesKerasFormula) {
  for (const char* bias : {"true", "false"}) {
    SCOPED_TRACE(bias);
    auto l = make(layer("multi_head_attention", {{"num_heads", "2"}, {"key_dim", "3"}, {"value_dim", "4"},
                                                 {"use_bias", bias}}),
                  {5, 6});
    ASSERT_EQ(l->out_shape, (Shape{5, 6}));
    const bool b = bias[0] == 't';
    ASSERT_EQ(l->param_size(), 6u * 6 * 2 + 6 * 8 + 8 * 6 + (b ? 6 + 6 + 8 + 6 : 0));
    auto p = uniform(l->param_size(), 70, -0.6f, 0.6f);
    const auto x = uniform(3 * 30, 71, -1, 1);
    expect_near(run(*l, x, 3, p), attention_reference(x, p, 3, 5, 6, 2, 3, 4, b), 1e-5);
  }
}

TEST(MultiHeadAttention, GradCheck) {
  auto l = make(layer("multi_head_attention", {{"num_heads", "2"}, {"key_dim", "3"}, {"value_dim", "2"}}), {4, 5});
  auto c = check_layer(*l, 2, uniform(40, 72, -1, 1), true);
  EXPECT_EQ(c.inputs, 40u);
  auto nb = make(layer("multi_head_attention", {{"num_heads", "3"}, {"key_dim", "2"}, {"use_bias", "false"}}), {3, 4});
  check_layer(*nb, 2, uniform(24, 73, -1, 1), true);
}

// Dropout on the attention weights: the Philox mask of (seed, step, layer, rank) over the
// batch's (sample, head, query, key) elements, the same function for every step's forward and
// backward; none at inference.
TEST(MultiHeadAttention, DropoutIsAFunctionOfSeedAndStep) {
  const uint32_t B = 2, T = 5, D = 4, H = 2, kd = 3;
  auto l = make(layer("multi_head_attention", {{"num_heads", "2"}, {"key_dim", "3"}, {"dropout", "0.3"}}), {T, D}, 7);
  auto p = uniform(l->param_size(), 74, -0.6f, 0.6f);
  const auto x = uniform(B * T * D, 75, -1, 1);
  l->begin_step(9, 4);
  const auto a = run(*l, x, B, p, true);
  const skyforge::kernels::DropoutKey key{9, 4, 7, 0};
  const uint32_t cut = skyforge::kernels::dropout_cut(0.3f);
  auto keep = [&](size_t n, size_t h, size_t i, size_t j) {
    return skyforge::kernels::dropout_keep(key, ((n * H + h) * T + i) * T + j, cut);
  };
  expect_near(a, attention_reference(x, p, B, T, D, H, kd, kd, true, 0.3, keep), 1e-5);
  l->begin_step(9, 5);
  EXPECT_NE(run(*l, x, B, p, true), a);  // a fresh mask every step
  l->begin_step(9, 4);
  EXPECT_EQ(run(*l, x, B, p, true), a);  // no generator state: a resumed run draws the same
  expect_near(run(*l, x, B, p, false), attention_reference(x, p, B, T, D, H, kd, kd, true), 1e-5);
  // The gradient of the masked function (the backward redraws the mask).
  l->begin_step(9, 4);
  check_layer(*l, B, x, true);
}

// ---- through the engine --------------------------------------------------------------------
namespace {

ModelSpec attention_model(uint32_t T, uint32_t D, uint32_t threads, const char* dropout) {
  ModelSpec m;
  m.input_shape = {T, D};
  m.layers = {layer("layer_normalization"),
              layer("multi_head_attention", {{"num_heads", "4"}, {"key_dim", "8"}, {"dropout", dropout}}),
              layer("dense", {{"units", "32"}, {"activation", "gelu"}}), layer("global_average_pooling1d"),
              layer("dense", {{"units", "4"}})};
  m.optimizer_options = opts({{"learning_rate", "0.01"}});
  m.seed = 3;
  m.threads = threads;
  return m;
}

// Mean loss of the first and the last `k` of `steps` training steps on one fixed batch.
std::pair<double, double> train(skyforge::Engine& e, const std::vector<float>& x, const std::vector<int32_t>& y,
                                int steps, int k = 3) {
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    const double loss = e.train_step(x.data(), y.data(), static_cast<uint32_t>(y.size())).loss;
    if (s < k) first += loss / k;
    if (s >= steps - k) last += loss / k;
  }
  return {first, last};
}

}  // namespace

// Label: which of the first 4 features has the largest mean over the sequence.
TEST(TransformerEngine, AttentionModelTrains) {
  const uint32_t B = 32, T = 8, D = 16;
  auto x = uniform(B * T * D, 80, -1, 1);
  std::vector<int32_t> y(B);
  for (uint32_t n = 0; n < B; ++n) {
    y[n] = static_cast<int32_t>(n % 4);
    for (uint32_t t = 0; t < T; ++t) x[(n * T + t) * D + y[n]] += 1.f;
  }
  CpuEngine e(attention_model(T, D, 2, "0.1"), skyforge::Communicator());
  const auto [first, last] = train(e, x, y, 25);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

// Tokens through embedding: the label says whether token 3 occurs.
TEST(TransformerEngine, EmbeddingModelTrains) {
  const uint32_t B = 32, T = 6;
  std::vector<float> x(B * T);
  std::vector<int32_t> y(B);
  skyforge::Rng rng(81);
  for (uint32_t n = 0; n < B; ++n) {
    for (uint32_t t = 0; t < T; ++t) x[n * T + t] = static_cast<float>(rng.next() % 3);  // 0, 1, 2
    y[n] = static_cast<int32_t>(n % 2);
    if (y[n]) x[n * T + rng.next() % T] = 3.f;
  }
  ModelSpec m;
  m.input_shape = {T};
  m.layers = {layer("embedding", {{"input_dim", "4"}, {"output_dim", "8"}}), layer("layer_normalization"),
              layer("multi_head_attention", {{"num_heads", "2"}, {"key_dim", "4"}}), layer("global_average_pooling1d"),
              layer("dense", {{"units", "2"}})};
  m.optimizer_options = opts({{"learning_rate", "0.01"}});
  m.seed = 4;
  CpuEngine e(m, skyforge::Communicator());
  const auto [first, last] = train(e, x, y, 25);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
  x[5] = 4.f;  // outside [0, input_dim)
  EXPECT_THROW(e.train_step(x.data(), y.data(), B), skyforge::Error);
}

TEST(TransformerEngine, PoolingAndActivationsModelTrains) {
  const uint32_t B = 16;
  auto x = uniform(B * 8 * 8 * 2, 82, -1, 1);
  std::vector<int32_t> y(B);
  for (uint32_t n = 0; n < B; ++n) {
    y[n] = static_cast<int32_t>(n % 2);
    for (uint32_t i = 0; i < 64; ++i) x[(n * 64 + i) * 2 + y[n]] += 0.5f;
  }
  ModelSpec m;
  m.input_shape = {8, 8, 2};
  m.layers = {layer("conv2d", {{"filters", "4"}, {"kernel_size", "3"}, {"activation", "tanh"}}),
              layer("average_pooling2d", {{"padding", "same"}}), layer("sigmoid"), layer("flatten"),
              layer("dense", {{"units", "8"}, {"activation", "sigmoid"}}), layer("gelu", {{"approximate", "true"}}),
              layer("dense", {{"units", "2"}})};
  m.optimizer_options = opts({{"learning_rate", "0.05"}});
  m.seed = 5;
  CpuEngine e(m, skyforge::Communicator());
  const auto [first, last] = train(e, x, y, 25);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

// Big enough that every layer splits its work over the threads: the weights after three steps
// (attention dropout on) are the same bits on 1 and on 3 threads.
TEST(TransformerEngine, ThreadCountChangesNoBit) {
  const uint32_t B = 16, T = 32, D = 64;
  const auto x = uniform(B * T * D, 83, -1, 1);
  std::vector<int32_t> y(B);
  for (uint32_t n = 0; n < B; ++n) y[n] = static_cast<int32_t>(n % 4);
  std::vector<std::vector<float>> params;
  for (uint32_t threads : {1u, 3u}) {
    CpuEngine e(attention_model(T, D, threads, "0.2"), skyforge::Communicator());
    ASSERT_EQ(e.threads(), static_cast<int>(threads));
    train(e, x, y, 3, 1);
    params.emplace_back(e.param_count());
    e.get_params(params.back().data(), params.back().size());
  }
  EXPECT_TRUE(params[0] == params[1]);
}
