#!/usr/bin/env bash
# Vulkan headers new enough for the pinned llama.cpp (ggml-vulkan.cpp needs vk::LayerSettingEXT: Vulkan 1.3.261+;
# Debian 12 has 1.3.239): Debian 13's libvulkan-dev, fetched with apt-get download from the trixie suite of the
# machine's own Debian mirror and unpacked with dpkg -x into DEST. Nothing from trixie is installed.
# usage: .ci/vulkan-headers.sh DEST      (prints DEST/usr/include, for -DVulkan_INCLUDE_DIR)
set -euo pipefail
dest=${1:?usage: vulkan-headers.sh DEST}
if [ -f "$dest/usr/include/vulkan/vulkan.hpp" ]; then echo "$dest/usr/include"; exit 0; fi
# the mirror this machine already uses for Debian (deb822 .sources or one-line .list)
uri=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)\/*[[:space:]]*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
[ -n "$uri" ] || uri=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\)\/\?[[:space:]].*/\2/p' \
  /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1)
[ -n "$uri" ] || { echo "no Debian mirror in this machine's apt sources" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  "$uri" > "$work/trixie.sources"
opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/parts" -o Dir::State::Lists="$work/lists"
      -o Dir::Cache::Archives="$work/archives" -o APT::Get::List-Cleanup=0)
mkdir -p "$work/parts"; cp "$work/trixie.sources" "$work/parts/"
apt-get "${opts[@]}" update -qq >/dev/null
(cd "$work" && apt-get "${opts[@]}" download -qq libvulkan-dev >/dev/null)
mkdir -p "$dest"
dpkg -x "$work"/libvulkan-dev_*.deb "$dest"
echo "$dest/usr/include"
