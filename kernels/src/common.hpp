// Shared by both builds' launch code (docs/kernels.md, "Two builds"). The including file first
// defines the one backend primitive:
//   template <class F> void for_n(Stream s, size_t n, const F& f, const char* what);
// which calls f(i) for every i in [0, n) (in any order, in parallel): a Thrust for_each_n over
// the OpenMP system in the host build, a grid-stride CUDA kernel queued on s in the CUDA build.
// Everything else — argument checks, how work is split, which functor runs — is this code,
// compiled twice.
#pragma once

#include <skyforge/kernels/launch.hpp>

#include <stdexcept>
#include <string>

namespace skyforge::kernels::impl {

inline void require(bool ok, const char* what, const char* msg) {
  if (!ok) throw std::invalid_argument(std::string("skyforge kernels: ") + what + ": " + msg);
}

// Column sums in deterministic stages (reduce.hpp) in the accumulator A (sums.hpp): stage 1
// into the workspace's first part, middle stages taking turns between its second part and its
// first, then the totals. stage1: K * cols calls that leave partial k of quantity q for column c
// at ws[(q * K + k) * cols + c] as A stores it (ColumnPartials<Q, Term, A>, or a kernel's own
// first stage with that layout).
template <int Q, class A, class Stage1, class Finish>
void reduce_stages(Stream s, size_t cols, size_t K, const Stage1& stage1, const Finish& finish, double* ws,
                   const char* what) {
  static_assert(Q >= 1 && Q <= 2, "the workspace holds two quantities' partials");
  require(ws != nullptr, what, "needs a workspace of reduce_workspace(rows, cols) doubles");
  for_n(s, K * cols, stage1, what);
  double *in = ws, *spare = ws + 2 * K * cols;
  while (K > kReduceFanIn) {
    const size_t next = reduce_next(K);
    for_n(s, next * cols, ColumnPartials<Q, PartialsTerm<Q>, A>{PartialsTerm<Q>{in, K, cols}, K, cols, next, spare},
          what);
    double* const done = in;
    in = spare;
    spare = done;
    K = next;
  }
  for_n(s, cols, ColumnTotals<Q, Finish, A>{finish, cols, K, in}, what);
}

// A column reduction of Term's Q quantities, in the accumulator s.reduction names (one dispatch
// for the launch).
template <int Q, class Term, class Finish>
void column_reduce(Stream s, size_t rows, size_t cols, const Term& term, const Finish& finish, double* ws,
                   const char* what) {
  const size_t K = reduce_split(rows, cols);
  with_sum(s.reduction, [&](auto sum) {
    using A = decltype(sum);
    reduce_stages<Q, A>(s, cols, K, ColumnPartials<Q, Term, A>{term, rows, cols, K, ws}, finish, ws, what);
  });
}

// Where per-column results go in a workspace, after column_reduce's partials.
inline double* workspace_tail(double* ws, size_t rows, size_t cols) { return ws + reduce_partials(rows, cols); }

}  // namespace skyforge::kernels::impl
