# checks.<system>: what `nix flake check` builds. No network, no root, no daemon.
#   unit           a small, named subset of the pytest suites, against the built package: it proves the tests run
#                  inside a Nix build on the package's own site-packages (the whole suite runs once, in the
#                  README's test command, where it costs no second run)
#   patch          `sparkstack patch check` on the fixture base and overlay
#   strip          `sparkstack strip` of a fixture checkpoint, then "up to date", then no MTP tensor left
#   image-fixture  lib.mkBase and lib.mkImage on fixture blobs (packages.image's path minus the fetch),
#                  `image verify`, and the same build by the CLI with its defaults: same manifest digest
{ pkgs, sparkstack, mkBase, mkImage, checkout }:
let
  python = pkgs.python3.withPackages (ps: sparkstack.dependencies ++ sparkstack.optional-dependencies.test
    ++ [ ps.pip ps.setuptools ps.wheel ]);
  sitePackages = "${sparkstack}/${pkgs.python3.sitePackages}";
  fixturesPy = "${checkout}/checks/nix/fixtures.py";
  env = ''export HOME="$TMPDIR" SPARKSTACK_CACHE_DIR="$TMPDIR/cache"'';

  # Fixture base, overlay source and pinned overlay, from checks/imagefix.py; deterministic, so the
  # committed ./fixture-pins.json (needed at evaluation time) must match what was generated.
  fixtures = pkgs.runCommand "sparkstack-fixture-image" { nativeBuildInputs = [ python ]; } ''
    python3 ${fixturesPy} image "$out"
    python3 ${fixturesPy} pins "$out/base" > pins.json
    if ! cmp -s pins.json ${./fixture-pins.json}; then
      echo "nix/fixture-pins.json does not match the fixture generator: run python checks/nix/fixtures.py image DIR && python checks/nix/fixtures.py pins DIR/base > nix/fixture-pins.json" >&2
      exit 1
    fi
  '';

  checkpoint = pkgs.runCommand "sparkstack-fixture-checkpoint" { nativeBuildInputs = [ python ]; } ''
    python3 ${fixturesPy} checkpoint "$out"
  '';

  fixtureImage = mkImage {
    inherit pkgs;
    base = mkBase { inherit pkgs; pins = ./fixture-pins.json; blobSource = "${fixtures}/base"; };
    overlaySrc = "${fixtures}/src";
    overlay = "${fixtures}/overlay";
  };
in
{
  unit = pkgs.runCommand "sparkstack-check-unit" { nativeBuildInputs = [ python sparkstack pkgs.skopeo pkgs.umoci ]; } ''
    ${env}
    cp -r --no-preserve=mode ${checkout} checkout
    cd checkout
    # One file per floor that needs no root, daemon or network: strip end to end, OCI documents, the recipe
    # corpus, launch's argv, and a property suite (derandomized, as in CI).
    SPARKSTACK_HYPOTHESIS_PROFILE=ci PYTHONPATH=${sitePackages} python3 -m pytest -q -p no:cacheprovider \
      --basetemp "$TMPDIR/pytest" \
      checks/unit/test_strip.py checks/unit/test_oci_documents.py checks/badinput/test_recipe_badinput.py \
      checks/unit/test_launch_plan.py checks/property/test_header_property.py
    touch "$out"
  '';

  patch = pkgs.runCommand "sparkstack-check-patch" { nativeBuildInputs = [ sparkstack ]; } ''
    ${env}
    sparkstack patch check --base ${fixtures}/base --overlay ${fixtures}/overlay --overlay-src ${fixtures}/src | tee "$out"
  '';

  strip = pkgs.runCommand "sparkstack-check-strip" { nativeBuildInputs = [ python sparkstack ]; } ''
    ${env}
    cp -r --no-preserve=mode ${checkpoint}/hub hub
    entry=hub/models--LibertAIDAI--GLM-5.3-Flash-NVFP4
    sparkstack strip "$entry" | tee "$out"
    sparkstack strip "$entry" | tee -a "$out" | grep -q "up to date"
    python3 ${fixturesPy} verify-strip "$entry-no-MTP"
  '';

  image-fixture = pkgs.runCommand "sparkstack-check-image-fixture" { nativeBuildInputs = [ python sparkstack ]; } ''
    ${env}
    sparkstack image verify ${fixtureImage}
    # The CLI with its defaults (no SOURCE_DATE_EPOCH, hardlinked or copied base blobs) must agree.
    (unset SOURCE_DATE_EPOCH; sparkstack image build --base ${fixtures}/base --overlay ${fixtures}/overlay \
      --overlay-src ${fixtures}/src --out cli --json > cli.json)
    python3 - ${fixtureImage} cli.json <<'PY'
    import json, sys
    index = json.load(open(sys.argv[1] + "/index.json"))
    nix = index["manifests"][0]["digest"]
    cli = json.load(open(sys.argv[2]))["result"]["manifest_digest"]
    print(f"nix-built manifest {nix}\ncli-built manifest {cli}")
    sys.exit(0 if nix == cli else "the Nix-built and CLI-built images differ")
    PY
    cp ${fixtureImage}/index.json "$out"
  '';
}
