// Registers the ssh provider as the plugin "ssh" (its logic lives in ssh_provider.cpp).
#include <skyforge/sdk.hpp>

#include "ssh_provider.hpp"

SKYFORGE_PLUGIN(skyforge::ssh::SshProvider, "ssh", "0.1.0",
                "nodes on hosts reached with the user's OpenSSH client: one multiplexed connection per host, "
                "files copied content-addressed, workers under a watchdog that stops them when the host goes")
