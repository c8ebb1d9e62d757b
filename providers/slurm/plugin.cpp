// Registers the slurm provider as the plugin "slurm" (its logic lives in slurm_provider.cpp).
#include <skyforge/sdk.hpp>

#include "slurm_provider.hpp"

SKYFORGE_PLUGIN(skyforge::slurm::SlurmProvider, "slurm", "0.1.0",
                "a pool allocated as one Slurm job: sbatch holds it, sbcast stages the files, one srun step per node")
