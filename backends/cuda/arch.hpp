// Whether this build's GPU code runs on a device (Device::probe, docs/compute-backends.md "The
// cuda engine"): a pure function of the device's compute capability and the architectures the
// build carries, so both builds compile it and the host build's tests check it without a GPU.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

namespace skyforge::cuda {

// real: the NN of CMAKE_CUDA_ARCHITECTURES' real code (NN-real, plain NN); its machine code runs
// on major NN/10 at or above NN. ptx: the NN of its PTX (NN-virtual, plain NN), which the driver
// compiles for any device at or above NN. Entries <= 0 mean nothing (the lists are never empty).
// Returns why the device cannot run this build, or nothing when it can.
inline std::optional<std::string> arch_refusal(int major, int minor, const std::string& device_name,
                                               std::initializer_list<int> real, std::initializer_list<int> ptx,
                                               const std::string& built_for) {
  const int cc = major * 10 + minor;
  for (int a : real)
    if (a > 0 && a / 10 == major && a <= cc) return std::nullopt;
  for (int a : ptx)
    if (a > 0 && a <= cc) return std::nullopt;
  return "cuda: device 0 (" + device_name + ") has compute capability " + std::to_string(major) + "." +
         std::to_string(minor) + "; this build carries code for " + built_for +
         " (rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(cc) + ")";
}

}  // namespace skyforge::cuda
