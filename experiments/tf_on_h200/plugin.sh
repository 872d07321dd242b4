#!/usr/bin/env bash
# On the GPU machine: put the DALI TF plugin carried in .daltf/ (built here against TF 2.21's headers
# by `pip install --no-build-isolation nvidia-dali-tf-plugin-cuda130`) beside the staged DALI in /tmp/site.
set -euo pipefail
if [[ -d .daltf/nvidia/dali_tf_plugin ]]; then
  mkdir -p /tmp/site/nvidia && cp -r .daltf/nvidia/dali_tf_plugin /tmp/site/nvidia/
fi
python3 -c "import nvidia.dali.plugin.tf as d; print('DALI TF plugin loads:', d.__name__)" 2>&1 | tail -1 | tee -a $OUT/device.txt
