# lib.mkImage { pkgs, base, overlaySrc, overlay ? ./overlays/dflash2, variant ? "plain", wheels ? null }:
# `sparkstack image build --link-base symlink` over a base layout (lib.mkBase) and the overlay's
# upstream checkout. The output is an OCI layout whose base blobs are symlinks to the base's store
# paths (a build user may not hardlink them, and a copy would double a 20 GB base). Only builtins
# and the given `pkgs` are used. The image is for the base's platform (arm64) on any build system.
{ pkgs, base, overlaySrc, overlay ? ../overlays/dflash2, variant ? "plain", wheels ? null }:
let
  sparkstack = import ./package.nix { inherit (pkgs) python3Packages; };
in
pkgs.runCommand "sparkstack-image-${variant}" { nativeBuildInputs = [ sparkstack ]; } ''
  export HOME="$TMPDIR" SPARKSTACK_CACHE_DIR="$TMPDIR/cache"
  # Bit-identity with a plain `sparkstack image build`, whose layer mtime defaults to 0: nixpkgs'
  # stdenv exports SOURCE_DATE_EPOCH=315532800, which would give another layer, config and manifest.
  export SOURCE_DATE_EPOCH=0
  sparkstack image build --base ${base} --overlay ${overlay} --overlay-src ${overlaySrc} \
    --variant ${variant} ${if wheels == null then "" else "--wheels ${wheels}"} \
    --link-base symlink --out "$out"
''
