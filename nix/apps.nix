# One app per CLI command that exists today, each a thin wrapper over the CLI. `launch`, `ship`, `sweep` and `up`
# pass the image this flake built (its store path) as --image, so `nix run .#launch -- 0` runs exactly it and
# `nix run .#ship` sends exactly it; a dry run builds it too, because the tag comes from its config digest.
# Every top-level command but patch has exactly one app (checks/unit/test_structure.py and
# checks/nix/test_flake_e2e.py keep it so).
{ pkgs, sparkstack, image }:
let
  app = name: args: {
    type = "app";
    program = "${pkgs.writeShellApplication {
      name = "sparkstack-${name}";
      runtimeInputs = [ sparkstack ];
      text = ''exec sparkstack ${args} "$@"'';
    }}/bin/sparkstack-${name}";
  };
in
{
  strip = app "strip" "strip";
  pin = app "pin" "pin";
  plan = app "plan" "plan";
  image = app "image" "image";
  launch = app "launch" "launch --image ${image}";
  ship = app "ship" "ship --image ${image}";
  verify = app "verify" "verify";
  tune = app "tune" "tune";
  soak = app "soak" "soak";
  top = app "top" "top";
  bench = app "bench" "bench";
  compare = app "compare" "compare";
  fetch = app "fetch" "fetch";
  sweep = app "sweep" "sweep --image ${image}";
  up = app "up" "up --image ${image}";
}
