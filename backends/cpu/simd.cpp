// Run-time choice of the SIMD kernel table (simd.hpp). Compiled for the baseline ISA.
#include "simd.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace skyforge::cpu::simd {

Isa supported() {
#if defined(SKYFORGE_CPU_SIMD)
  static const Isa isa = [] {
    __builtin_cpu_init();
    // The compiler's runtime checks the OS saves the registers too (xgetbv), not only cpuid.
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma"))
      return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
    return Isa::none;
  }();
  return isa;
#else
  return Isa::none;
#endif
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "none";
  }
}

namespace {

const Kernels* table_for(Isa isa) {
#if defined(SKYFORGE_CPU_SIMD)
  if (isa == Isa::avx512) return &avx512::table;
  if (isa == Isa::avx2) return &avx2::table;
#endif
  (void)isa;
  return nullptr;
}

Isa cap(Isa want) { return static_cast<int>(want) < static_cast<int>(supported()) ? want : supported(); }

std::atomic<const Kernels*>& current() {
  static std::atomic<const Kernels*> k{[] {
    Isa want = Isa::avx512;
    if (const char* e = std::getenv("SKYFORGE_CPU_ISA")) {
      if (std::strcmp(e, "none") == 0 || std::strcmp(e, "blas") == 0) want = Isa::none;
      else if (std::strcmp(e, "avx2") == 0) want = Isa::avx2;
    }
    return table_for(cap(want));
  }()};
  return k;
}

}  // namespace

const Kernels* kernels() { return current().load(std::memory_order_relaxed); }

const RowKernels& row_kernels() {
  const Kernels* k = kernels();
  return k ? *k->rows : portable::row_table;
}

Isa set_isa(Isa isa) {
  const Kernels* k = table_for(cap(isa));
  current().store(k, std::memory_order_relaxed);
  return k ? k->isa : Isa::none;
}

}  // namespace skyforge::cpu::simd
