#!/usr/bin/env bash
# Configuring with a feature forced ON whose tool is missing must fail and name the package.
set -u
cmake=$1 src=$2 dir=$3
rm -rf "$dir"
out=$("$cmake" -S "$src" -B "$dir" -G Ninja -DCOLIBRI_BUILD_TESTS=OFF -DCOLIBRI_WITH_CUDA=OFF \
      -DCOLIBRI_WITH_VULKAN=ON -DGLSLC_PROGRAM=/nonexistent/glslc 2>&1)
rc=$?
rm -rf "$dir"
flat=$(echo "$out" | tr -s ' \n' '  ')
if [ $rc -ne 0 ] && [[ "$flat" == *"COLIBRI_WITH_VULKAN=ON but Vulkan headers or glslc were not found (apt-get install libvulkan-dev glslc)"* ]]; then
  echo "configure refused with the package named"
  exit 0
fi
echo "unexpected (exit $rc):"; echo "$out" | tail -20
exit 1
