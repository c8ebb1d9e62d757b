// NCCL_SOCKET_IFNAME for the CUDA build's communicator (docs/compute-backends.md "The cuda
// engine"): a pure decision, so that the host build's tests check it, and the export that
// device_cuda.cpp makes before NCCL starts.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "address.hpp"  // plugins/common: fw::interface_of

namespace skyforge::cuda {

// NCCL's bootstrap and socket transport bind the interface the hostname resolves to unless
// NCCL_SOCKET_IFNAME names one: on hosts whose names resolve to a loopback address, each rank
// would offer its peers 127.0.x.x. The interface that holds the node's pool address is the one
// its peers reach (the torch plugin exports the same), named exactly: "=eth1", since NCCL takes
// a bare name as a prefix (eth1 would admit eth10 too). `current`: the variable's value, null
// where unset; a set one, even empty, is the user's and stays. Nothing either where no
// interface of this machine holds `private_ip`.
inline std::optional<std::string> nccl_socket_ifname(const char* current, const std::string& private_ip) {
  if (current) return std::nullopt;
  std::string ifname = fw::interface_of(private_ip);
  if (ifname.empty()) return std::nullopt;
  return "=" + ifname;
}

// Sets NCCL_SOCKET_IFNAME in this process as nccl_socket_ifname decides: before the
// communicator's init, which reads it.
inline void export_nccl_socket_ifname(const std::string& private_ip) {
  if (auto ifname = nccl_socket_ifname(std::getenv("NCCL_SOCKET_IFNAME"), private_ip))
    ::setenv("NCCL_SOCKET_IFNAME", ifname->c_str(), 0);
}

}  // namespace skyforge::cuda
