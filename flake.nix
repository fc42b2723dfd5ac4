{
  description = "sparkstack: GLM-5.3-Flash NVFP4 + DFlash2 on vLLM across DGX Spark pairs, from pinned inputs";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    # The DFlash2 overlay's upstream checkout, at the rev overlays/dflash2/overlay.toml pins (same full rev).
    # Not in flake.lock: its narHash cannot be computed here (GitHub is out of reach), and a made-up one
    # would fail for every online user. Nix locks it on first online use.
    overlay-src = {
      url = "github:tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark/06b681991fb7ca6743c4fba535cdc7e8df78cd4b";
      flake = false;
    };
  };

  # Wiring only: every output calls the sparkstack CLI (python/), which holds all the logic.
  outputs = { self, nixpkgs, overlay-src }:
    let
      systems = [ "aarch64-linux" "x86_64-linux" ];
      forAllSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; }) systems);

      perSystem = system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
          sparkstack = import ./nix/package.nix { inherit (pkgs) python3Packages; };
          base = self.lib.mkBase { inherit pkgs; pins = ./nix/pins.json; };
          image = variant: self.lib.mkImage {
            inherit pkgs base variant;
            overlaySrc = overlay-src;
            wheels = if variant == "plain" then null else import ./nix/wheels.nix { inherit pkgs variant; };
          };
          packages = {
            default = sparkstack;
            inherit base;
            image = image "plain";
            image-instanttensor = image "instanttensor";
          };
        in
        {
          inherit packages;
          apps = import ./nix/apps.nix { inherit pkgs sparkstack; image = packages.image; };
          checks = import ./nix/checks.nix {
            inherit pkgs sparkstack;
            inherit (self.lib) mkBase mkImage;
            checkout = (import ./nix/source.nix).checkout;
          };
          devShells.default = pkgs.mkShell {
            packages = [
              (pkgs.python3.withPackages (ps: sparkstack.dependencies ++ sparkstack.optional-dependencies.test
                ++ [ ps.pip ps.setuptools ps.wheel ]))
              pkgs.skopeo
              pkgs.umoci
            ];
            # The checkout's own package, so edits take effect without an install.
            shellHook = ''export PYTHONPATH="$PWD/python''${PYTHONPATH:+:$PYTHONPATH}"'';
          };
          formatter = pkgs.nixfmt;
        };
      each = forAllSystems perSystem;
      pick = attr: builtins.mapAttrs (_: s: s.${attr}) each;
    in
    {
      # lib.mkBase { pkgs, pins, platform ? "linux/arm64" } and lib.mkImage { pkgs, base, overlaySrc,
      # overlay ? ./overlays/dflash2, variant ? "plain", wheels ? null }: builtins and the given pkgs only.
      lib = {
        mkBase = import ./nix/base.nix;
        mkImage = import ./nix/image.nix;
      };
      packages = pick "packages";
      apps = pick "apps";
      checks = pick "checks";
      devShells = pick "devShells";
      formatter = pick "formatter";
    };
}
