# The checkout's files the flake's derivations read, as two filtered store paths (builtins only), so
# that editing the README, docs/ or a Nix file rebuilds nothing:
#   package:  python/, overlays/, recipes/  (python/sparkstack/data/* are symlinks into the last two)
#   checkout: the same plus checks/ and nix/pins.json, for the test suites (checks.unit)
let
  root = toString ../.;
  rel = p: builtins.substring (builtins.stringLength root + 1) (builtins.stringLength p) p;
  top = r: builtins.head (builtins.split "/" r);
  startsWith = prefix: s: builtins.substring 0 (builtins.stringLength prefix) s == prefix;
  junk = name: builtins.elem name [ "__pycache__" "build" "dist" ".pytest_cache" ".hypothesis" ]
    || builtins.match ".*\\.(egg-info|pyc)" name != null;
  select = name: tops: files: builtins.path {
    path = ../.;
    inherit name;
    filter = p: type:
      let r = rel p; in
      !(junk (baseNameOf p))
      && (builtins.elem (top r) tops || builtins.elem r files
          || (type == "directory" && builtins.any (startsWith (r + "/")) files));
  };
in
{
  package = select "sparkstack-source" [ "python" "overlays" "recipes" ] [ ];
  checkout = select "sparkstack-checkout" [ "python" "overlays" "recipes" "checks" ] [ "nix/pins.json" ];
}
