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
  test = with python3Packages; [ pytest hypothesis safetensors numpy torch ];
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
  pythonImportsCheck = [ "sparkstack" ];

  # For checks.unit and the dev shell, whichever nixpkgs builds this.
  passthru = { inherit dependencies; optional-dependencies.test = test; };

  meta = {
    description = "Pinned, planned, content-addressed serving of GLM-5.3-Flash NVFP4 + DFlash2 on DGX Spark pairs";
    mainProgram = "sparkstack";
    platforms = [ "aarch64-linux" "x86_64-linux" ];
  };
}
