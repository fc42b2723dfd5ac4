# The sparkstack CLI, built the nixpkgs way. `src` is the filtered checkout (./source.nix): the
# package sits in python/, and its data dirs are symlinks to the checkout's overlays/ and recipes/.
{ python3Packages, src ? (import ./source.nix).package }:
let
  # Exactly [project] dependencies of python/pyproject.toml (checks/nix/test_flake_files.py keeps them equal).
  dependencies = with python3Packages; [
    click
    rich
    huggingface-hub
    zstandard
    installer
    requests
    urllib3
    prometheus-client
    tomlkit
    plumbum
    matplotlib
  ];
  # The test extra, for checks.unit and the dev shell.
  test = with python3Packages; [ pytest pytest-xdist hypothesis safetensors numpy torch ];
in
python3Packages.buildPythonApplication {
  pname = "sparkstack";
  version = "0.1.0"; # python/pyproject.toml; checks/nix/test_flake_files.py keeps them equal
  pyproject = true;
  inherit src;
  sourceRoot = "sparkstack-source/python";

  build-system = with python3Packages; [ setuptools ];
  inherit dependencies;
  optional-dependencies.test = test;

  # The suites need the whole checkout (checks/, overlays/, recipes/, nix/pins.json): they run as checks.unit.
  doCheck = false;
  # Every sparkstack module a user's command imports (cli.py imports each command's package when it runs):
  # an import missing from `dependencies` fails the build here, not a user's command (checks/nix/
  # test_flake_files.py keeps this list equal to what cli.py and its command objects import). Imports inside
  # functions are held to pyproject by checks/unit/test_declared_imports.py instead.
  pythonImportsCheck = [
    "sparkstack"
    "sparkstack.bench"
    "sparkstack.bench.command"
    "sparkstack.bench.compare"
    "sparkstack.bench.plan"
    "sparkstack.bench.plot"
    "sparkstack.bench.reference"
    "sparkstack.bench.report"
    "sparkstack.bench.run"
    "sparkstack.bench.suite"
    "sparkstack.checkline"
    "sparkstack.cli"
    "sparkstack.command"
    "sparkstack.deploy"
    "sparkstack.endpoint.client"
    "sparkstack.errors"
    "sparkstack.fetch"
    "sparkstack.fetch.apply"
    "sparkstack.fetch.command"
    "sparkstack.fetch.plan"
    "sparkstack.fsio"
    "sparkstack.hfcache"
    "sparkstack.image"
    "sparkstack.image.command"
    "sparkstack.image.plan"
    "sparkstack.interrupt"
    "sparkstack.launch"
    "sparkstack.launch.apply"
    "sparkstack.launch.calibrate"
    "sparkstack.launch.command"
    "sparkstack.launch.kv"
    "sparkstack.launch.plan"
    "sparkstack.launch.preflight"
    "sparkstack.launch.report"
    "sparkstack.oci"
    "sparkstack.oci.command"
    "sparkstack.oci.load"
    "sparkstack.oci.pins"
    "sparkstack.oci.pull"
    "sparkstack.oci.verify"
    "sparkstack.options"
    "sparkstack.patch"
    "sparkstack.patch.command"
    "sparkstack.patch.drift"
    "sparkstack.patch.pin"
    "sparkstack.recipe"
    "sparkstack.remote"
    "sparkstack.ship"
    "sparkstack.ship.command"
    "sparkstack.ship.report"
    "sparkstack.shipped"
    "sparkstack.soak"
    "sparkstack.soak.command"
    "sparkstack.soak.plan"
    "sparkstack.soak.report"
    "sparkstack.soak.run"
    "sparkstack.state"
    "sparkstack.strip"
    "sparkstack.strip.apply"
    "sparkstack.strip.command"
    "sparkstack.strip.plan"
    "sparkstack.sweep"
    "sparkstack.sweep.command"
    "sparkstack.sweep.plan"
    "sparkstack.sweep.plot"
    "sparkstack.sweep.report"
    "sparkstack.sweep.state"
    "sparkstack.terminal"
    "sparkstack.text"
    "sparkstack.top"
    "sparkstack.top.command"
    "sparkstack.top.view"
    "sparkstack.top.watch"
    "sparkstack.tune"
    "sparkstack.tune.apply"
    "sparkstack.tune.command"
    "sparkstack.tune.plan"
    "sparkstack.units"
    "sparkstack.up"
    "sparkstack.up.apply"
    "sparkstack.up.command"
    "sparkstack.up.plan"
    "sparkstack.up.report"
    "sparkstack.verify"
    "sparkstack.verify.command"
    "sparkstack.verify.run"
  ];

  # For checks.unit and the dev shell, whichever nixpkgs builds this.
  passthru = { inherit dependencies; optional-dependencies.test = test; };

  meta = {
    description = "Pinned, planned, content-addressed serving of GLM-5.3-Flash NVFP4 + DFlash2 on DGX Spark pairs";
    mainProgram = "sparkstack";
    platforms = [ "aarch64-linux" "x86_64-linux" ];
  };
}
