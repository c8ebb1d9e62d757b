# No arguments: the `jax` plugin exports JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
# JAX_PROCESS_ID, and its sitecustomize hook lets jax's cluster detection read them.
# Without the hook (python_hook = false) the one line is:
#   jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"],
#                              int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"]))
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

jax.distributed.initialize()
mesh = Mesh(np.array(jax.devices()), ("d",))
sharding = NamedSharding(mesh, P("d"))
index = {d: i for i, d in enumerate(jax.devices())}  # the global mesh order, 0 .. devices-1
local = [jax.device_put(jnp.full((1,), float(index[d])), d) for d in jax.local_devices()]
x = jax.make_array_from_single_device_arrays((len(jax.devices()),), sharding, local)
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
print(f"process {jax.process_index()}/{jax.process_count()} devices {len(jax.devices())} "
      f"sum_of_device_indices {float(total):.0f}", flush=True)
jax.distributed.shutdown()
