// Registers the aws provider as the plugin "aws" (its logic: ec2_pool.cpp, aws_provider.cpp).
#include <skyforge/sdk.hpp>

#include "aws_provider.hpp"

SKYFORGE_PLUGIN(skyforge::aws::AwsProvider, "aws", "0.1.0",
                "EC2 instances made for one pool and terminated after it (libcurl + SigV4), run over SSH as the "
                "ssh provider runs hosts; a dead-man switch powers them off if the host goes")
