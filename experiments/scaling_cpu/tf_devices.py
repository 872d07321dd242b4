"""``python experiments/scaling_cpu/tf_devices.py N [tf_impl.train flags]``: the TF trainer on N
logical CPU devices of this process (``MirroredStrategy``), as JAX's
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` gives JAX N CPU devices."""

import sys

from shared_data.core.errors import run_cli

from tf_impl import cluster, train

if __name__ == "__main__":
    n = sys.argv[1]
    cluster.split_cpu(int(n))
    raise SystemExit(run_cli(train.main, [*sys.argv[2:], "--num_devices", n]))
