# A host-tools STAND-IN for nixpkgs, used only offline, with
#   --override-input nixpkgs path:./nix/stub
# It proves the flake's WIRING (which derivations exist, what they run, what they depend on, that
# `nix build`, `nix run` and `nix flake check` really build and run them). It does NOT prove
# nixpkgs' own build of sparkstack: no nixpkgs Python, no nixpkgs bootstrap, no sandbox.
#
# It offers the attribute names and argument signatures of nixpkgs for exactly what this flake
# uses (runCommand, writeText, writeShellApplication, linkFarm, mkShell, python3,
# python3Packages.buildPythonApplication and the Python packages named, cacert, and a few host
# tools), each implemented as a plain `derivation { builder = "/bin/bash"; ... }` over:
#   - host programs from Debian packages (linked into the store by path, never copied);
#   - one host venv, /opt/sparkstack-nix-stub-venv, built by nix/stub/make-venv from the
#     checkout's pyproject.toml (dependencies and test extra only, never sparkstack itself).
# See default.nix for the details and ../../docs/nix.md for what this does and does not verify.
{
  description = "sparkstack's offline stand-in for nixpkgs: same names and signatures, host tools underneath";

  outputs = { self }: {
    legacyPackages = builtins.listToAttrs (map
      (system: { name = system; value = import ./default.nix { inherit system; }; })
      [ "x86_64-linux" "aarch64-linux" ]);
  };
}
