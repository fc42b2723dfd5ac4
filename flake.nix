{
  description = "sparkstack: GLM-5.3-Flash NVFP4 + DFlash2 on vLLM across DGX Spark pairs, from pinned inputs";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    # The overlay's files are no input: Nix locks every input at evaluation, so a GitHub input would need
    # GitHub for every build. They come from the blog's bundle in the store (nix/bundle.nix, requireFile),
    # or, under --impure, from the checkout SPARKSTACK_OVERLAY_SRC names (docs/nix.md).
  };

  # Wiring only: every output calls the sparkstack CLI (python/), which holds all the logic.
  outputs = { self, nixpkgs }:
    let
      systems = [ "aarch64-linux" "x86_64-linux" ];
      forAllSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; }) systems);

      perSystem = system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
          sparkstack = import ./nix/package.nix { inherit (pkgs) python3Packages; };
          base = self.lib.mkBase { inherit pkgs; pins = ./nix/pins.json; };
          overlay-bundle = self.lib.overlayBundle { inherit pkgs; };
          checkout = builtins.getEnv "SPARKSTACK_OVERLAY_SRC";  # "" unless --impure
          image = variant: self.lib.mkImage {
            inherit pkgs base variant;
            overlaySrc =
              if checkout == "" then overlay-bundle
              else if builtins.substring 0 1 checkout != "/" then
                throw "sparkstack: SPARKSTACK_OVERLAY_SRC=${checkout} is not an absolute path (Nix does not expand ~ or read it from this directory)"
              else builtins.path { path = checkout; name = "overlay-src"; filter = p: _: baseNameOf p != ".git"; };
            wheels = if variant == "plain" then null else import ./nix/wheels.nix { inherit pkgs variant; };
          };
          packages = {
            default = sparkstack;
            inherit base overlay-bundle;
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
      # lib.mkBase { pkgs, pins, platform ? "linux/arm64" }, lib.mkImage { pkgs, base, overlaySrc,
      # overlay ? ./overlays/dflash2, variant ? "plain", wheels ? null } and lib.overlayBundle { pkgs,
      # overlay ? ./overlays/dflash2 }: builtins and the given pkgs only.
      lib = {
        mkBase = import ./nix/base.nix;
        mkImage = import ./nix/image.nix;
        overlayBundle = import ./nix/bundle.nix;
      };
      packages = pick "packages";
      apps = pick "apps";
      checks = pick "checks";
      devShells = pick "devShells";
      formatter = pick "formatter";
    };
}
