# Sourced by this study's GPU recipes (checkout root, $OUT set): DALI from /tmp/site, the device
# record and the data (scripts/gpu/common.sh), TF's staged runtime (/tmp/tf-env.sh), the DALI TF
# plugin carried in .daltf/, and TF's and Keras' versions added to $OUT/device.txt.
export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh
source scripts/gpu/common.sh
source /tmp/tf-env.sh
export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
bash experiments/tf_on_h200/plugin.sh
python3 -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__, tf.config.list_physical_devices('GPU'))" | tee -a $OUT/device.txt
