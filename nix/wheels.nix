# The wheels a variant installs (overlay.toml's [[variants.<variant>.wheels]]), as one directory for
# `image build --wheels`. overlay.toml pins each by file name and sha256 but no URL, so Nix cannot
# fetch them: each is a fixed-output path (pkgs.requireFile) that the user adds once with
# `nix-store --add-fixed sha256 FILE`. Unpinned wheels fail at build time, in one line.
{ pkgs, variant, overlay ? ../overlays/dflash2 }:
let
  toml = builtins.fromTOML (builtins.readFile (overlay + "/overlay.toml"));
  wheels = (toml.variants.${variant} or { }).wheels or [ ];
  unpinned = map (w: w.file) (builtins.filter (w: w.sha256 == "unpinned") wheels);
  wheel = w: pkgs.requireFile {
    name = w.file;
    sha256 = w.sha256;
    message = "sparkstack: the ${variant} wheel ${w.file} (sha256 ${w.sha256}, pinned in overlay.toml) is not in the Nix store: add it with `nix-store --add-fixed sha256 ${w.file}`";
  };
in
if unpinned != [ ] then
  pkgs.runCommand "sparkstack-wheels-${variant}-unpinned" { } ''
    echo "sparkstack: error: overlay.toml: the ${variant} wheels are unpinned (${builtins.concatStringsSep ", " unpinned}): run \`sparkstack pin overlay --overlay-src CHECKOUT --wheels DIR\`, commit overlay.toml, then \`nix-store --add-fixed sha256 DIR/*.whl\`" >&2
    exit 1
  ''
else pkgs.linkFarm "sparkstack-wheels-${variant}" (map (w: { name = w.file; path = wheel w; }) wheels)
