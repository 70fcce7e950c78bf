# Sourced by tools/gpu_run.sh and tools/gpu/ab.sh: the setup both need on a GPU machine.
#   gpu_env SITE   wheels carried in .whl/ (the machine has no registry) installed into SITE and
#                  put on PYTHONPATH; CC/CXX set to the distribution's compilers where they exist.
# This image's CXX (/opt/gcc/bin/g++) is a wrapper whose extensions crash when a C++ exception
# crosses into torch (seen 2026-12-02: every TORCH_CHECK segfaulted); the distribution's g++ of
# the same version works, so builds use it where it exists (gpu_run.sh's error-path check guards).
gpu_env() {
  if [ -d .whl ]; then
    ${PY:-python3} -m pip install -q --no-index --no-deps --no-compile --target "$1" .whl/*.whl \
      && export PYTHONPATH=$1${PYTHONPATH:+:$PYTHONPATH}
  fi
  if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
}
