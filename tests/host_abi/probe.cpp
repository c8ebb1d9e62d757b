// Compiled by tests/host_abi against skyforge::abi's include directory only: the headers the host
// may read are found, SKYFORGE_PROBE_HEADER (a header of the SDK's C++ layer) is not.
#include <skyforge/abi.h>
#include <skyforge/layer_schema.hpp>

#include SKYFORGE_PROBE_HEADER
