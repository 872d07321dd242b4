#!/usr/bin/env bash
# Bring NVIDIA DALI (CUDA 13 build, Python 3.12) to a GPU machine that reaches no package registry.
#   here:  bash experiments/gpu_machine/stage_dali.sh          -> ignored folders .dali/p0 .dali/p1 .dali/p2
#   there: the three parts arrive in three calls (each call carries at most 64 MiB), then
#          bash .dali/p2/install_dali.sh            -> DALI importable from /tmp/site
# Every later command on that machine runs with PYTHONPATH=/tmp/site exported (scripts/gpu/common.sh adds .).
# Idempotent: reuses .dali/ when it holds the same version.
set -euo pipefail
VERSION=${DALI_VERSION:-2.4.0}
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.dali/' .git/info/exclude 2>/dev/null || echo '/.dali/' >> .git/info/exclude
if [[ -s .dali/p2/dali.part.02 && -f .dali/VERSION && $(cat .dali/VERSION) == "$VERSION" ]]; then
  echo "stage_dali: .dali/ already holds DALI $VERSION"; exit 0
fi
rm -rf .dali && mkdir -p .dali/p0 .dali/p1 .dali/p2 .dali/tmp
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d .dali/tmp "nvidia-dali-cuda130==$VERSION"
# DALI's own Python dependencies that the GPU image lacks (small wheels), and nvtx for NVTX ranges
python3 -m pip download -q --no-deps "${plat[@]}" -d .dali/p0 makefun "astunparse<=1.6.3" "gast<=0.7.0" optree "libcst~=1.8" nvtx
mkdir -p .dali/tmp/x && (cd .dali/tmp/x && unzip -q ../nvidia_dali_cuda130-*.whl)
find .dali/tmp/x/nvidia/dali -maxdepth 1 -name 'backend_impl.cpython-*.so' ! -name '*cpython-312-*' -delete
(cd .dali/tmp/x && tar cf - .) | xz -T0 -6 > .dali/tmp/dali.tar.xz
split -n 3 -d .dali/tmp/dali.tar.xz .dali/tmp/dali.part.
for i in 0 1 2; do mv .dali/tmp/dali.part.0$i .dali/p$i/; done
cat > .dali/p2/install_dali.sh <<'SH'
#!/usr/bin/env bash
# On the GPU machine, after .dali/p0 and .dali/p1 were copied to /tmp/stage by the two calls before.
set -euo pipefail
mkdir -p /tmp/stage /tmp/site
cp .dali/p2/* /tmp/stage/
cat /tmp/stage/dali.part.00 /tmp/stage/dali.part.01 /tmp/stage/dali.part.02 | xz -d | tar xf - -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/stage/*.whl
rm -f /tmp/stage/dali.part.*
PYTHONPATH=/tmp/site python3 -c "import nvidia.dali as d; print('DALI', d.__version__, 'ready in /tmp/site')"
SH
rm -rf .dali/tmp; echo "$VERSION" > .dali/VERSION
du -sh .dali/p0 .dali/p1 .dali/p2
echo "calls: (1) carry .dali/p0: mkdir -p /tmp/stage && cp .dali/p0/* /tmp/stage/"
echo "       (2) carry .dali/p1: cp .dali/p1/* /tmp/stage/"
echo "       (3) carry .dali/p2: bash .dali/p2/install_dali.sh && <command>"
