# The blog's bundle of the overlay files (its working directory, as one archive), as nixpkgs' requireFile
# takes a file no URL may fetch: overlay.toml's [source] bundle_sha256 names it, and the user adds the file
# they downloaded to the store once. With it there, `nix build .#image` reaches no network for the overlay.
# `sparkstack image build` checks the bundle's sha256 again, then every file's, before it unpacks a byte.
{ pkgs, overlay ? ../overlays/dflash2 }:
let
  source = (builtins.fromTOML (builtins.readFile (overlay + "/overlay.toml"))).source;
  sha256 = source.bundle_sha256 or "";
  name = "glm5.3-flash-spark-bundle";  # the blog names no file: the store name every user adds it under
in
if builtins.match "[0-9a-f]{64}" sha256 == null then
  throw "sparkstack: overlay.toml [source] bundle_sha256 is not a sha256 (${sha256}): the flake builds the image from the blog's bundle"
else
  pkgs.requireFile {
    inherit name sha256;
    message = ''
      sparkstack: the blog's overlay bundle (sha256 ${sha256}, pinned in overlays/dflash2/overlay.toml) is not in the Nix store.
      Download it from the blog, then add it under the name the flake asks for:
        cp DOWNLOADED-FILE ${name} && nix-store --add-fixed sha256 ${name}
      Or build from an upstream checkout instead:
        SPARKSTACK_OVERLAY_SRC=$HOME/src/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark nix build --impure .#image'';
  }
