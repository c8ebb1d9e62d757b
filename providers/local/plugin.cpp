// Registers the local provider as the plugin "local" (its logic lives in local_provider.cpp).
#include <skyforge/sdk.hpp>

#include "local_provider.hpp"

SKYFORGE_PLUGIN(skyforge::local::LocalProvider, "local", "0.1.0",
                "N nodes on this machine: one worker process and work directory per node; isolation = \"netns\" "
                "gives each node its own network namespace and address")
