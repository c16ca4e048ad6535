#!/bin/bash
# Build .dev/site.tgz: the Python packages fnrl needs beyond a GPU machine's image (torch, numpy,
# matplotlib, tensorboard... are there), as cp312 wheels unpacked, EnvPool slimmed to CartPole /
# Pendulum / MuJoCo gym / Atari code (its other families' binaries and assets dropped, so the
# archive stays well under a 64 MiB transfer). Run here; carry .dev to the GPU machine and start
# there with benchmarks/gpu_run.sh. Add /.dev/ and /.whl/ to .git/info/exclude first.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
mkdir -p .whl .dev
P="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
for p in envpool==1.2.5 envpool-assets==0.3.0 tensordict==0.15.3 pyvers gymnasium farama-notifications tyro \
         docstring-parser typeguard dm-env dm-tree optree types-protobuf glfw; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $P -d .whl "$p"
done
site=$(mktemp -d)
cd "$site"
for w in "$ROOT"/.whl/*.whl; do
  case $w in *envpool_assets*) unzip -q -o "$w" 'envpool_assets/__init__.py' 'envpool_assets/mujoco/assets_gym/*' \
                                 'envpool_assets-*.dist-info/*' ;;
             *) unzip -q -o "$w" ;; esac
done
mkdir -p envpool_assets/atari/roms
cd envpool
rm -f {vizdoom,gfootball,jumanji,procgen,minigrid,box2d}/*.so mujoco/{playground,mujoco_dmc,myosuite,robotics}_envpool.so
rm -rf vizdoom/bin
for d in vizdoom gfootball jumanji procgen minigrid box2d mujoco/dmc mujoco/myosuite mujoco/playground mujoco/robotics \
         mujoco/metaworld; do   # envpool imports every family's registration: empty ones stand in
  echo '"""dropped from this slim copy"""' > $d/__init__.py
  echo > $d/registration.py
done
cd "$site"
tar czf "$ROOT/.dev/site.tgz" --exclude=__pycache__ .
rm -rf "$site"
ls -la "$ROOT/.dev/site.tgz"
