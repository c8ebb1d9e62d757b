# A real JAX multi-process run: a bare jax.distributed.initialize() (the `jax` plugin's
# JAX_COORDINATOR_ADDRESS plus its sitecustomize hook for the process count and id), then a
# cross-process sum. Prints, for test_framework_e2e.cpp (JaxBareInitializeFormsTheWorld):
#   index=<i> count=<processes> devices=<global devices>
#   gathered=<every process's value, in process order> sum=<their sum>
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

jax.distributed.initialize()
assert jax.process_count() == 2, jax.process_count()
index = jax.process_index()
print("index=%d count=%d devices=%d" % (index, jax.process_count(), len(jax.devices())), flush=True)
# Each process contributes index + 1; process_allgather runs a collective over the global devices.
gathered = np.asarray(multihost_utils.process_allgather(jnp.array([index + 1], dtype=jnp.int32)))
print("gathered=%s sum=%d" % (",".join(str(int(v)) for v in gathered.reshape(-1)), int(gathered.sum())), flush=True)
jax.distributed.shutdown()
