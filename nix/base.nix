# lib.mkBase { pkgs, pins, platform ? "linux/arm64" }: the pinned base image as an OCI layout whose
# blobs are store paths, one fixed-output derivation per manifest, config and layer.
#
# `pins` is nix/pins.json's content (an attrset) or a path to such a file. Only builtins and the
# given `pkgs` are used (no nixpkgs lib), so a caller may pass any nixpkgs, or nix/stub.
# `blobSource` (optional, for checks.image-fixture) is a directory holding blobs/sha256/<hex>: each
# blob derivation then copies from it instead of fetching; everything else is the same path.
{ pkgs, pins, platform ? "linux/arm64", blobSource ? null }:
let
  p = if builtins.isAttrs pins then pins else builtins.fromJSON (builtins.readFile pins);
  sparkstack = import ./package.nix { inherit (pkgs) python3Packages; };
  pinned = p.platforms.${platform} or null;

  # The file `pin fetch` reads: the same pins, whatever form they came in.
  pinsFile = builtins.toFile "pins.json" (builtins.toJSON p);
  hexOf = d:
    let m = builtins.match "sha256:([0-9a-f]{64})" d.digest; in
    if m == null then throw "nix/pins.json: ${d.digest} is not a sha256 digest" else builtins.head m;

  # nixpkgs' fetchers' impure variables (lib/fetchers.nix proxyImpureEnvVars: the proxies, and a CA bundle
  # for an https proxy), then the registry mirror (tests point it at a stand-in) and its timeout.
  impureEnvVars = [ "http_proxy" "https_proxy" "ftp_proxy" "all_proxy" "no_proxy"
    "HTTP_PROXY" "HTTPS_PROXY" "FTP_PROXY" "ALL_PROXY" "NO_PROXY" "NIX_SSL_CERT_FILE"
    "SPARKSTACK_REGISTRY_MIRROR" "SPARKSTACK_REGISTRY_TIMEOUT" ];

  # One store path per blob, named and hashed by the blob's own digest: the store path depends on
  # nothing else, so a new base tag refetches only the blobs whose digests changed, and Nix itself
  # checks every byte (a wrong blob fails with Nix's "hash mismatch in fixed-output derivation").
  blob = d: pkgs.runCommand "oci-blob-${hexOf d}"
    ({
      outputHashMode = "flat";
      outputHashAlgo = "sha256";
      outputHash = hexOf d;
      preferLocalBuild = true;
    } // (if blobSource != null then { } else {
      nativeBuildInputs = [ sparkstack ];
      inherit impureEnvVars;
      # requests ignores SSL_CERT_FILE; it reads REQUESTS_CA_BUNDLE.
      SSL_CERT_FILE = "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt";
      REQUESTS_CA_BUNDLE = "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt";
    }))
    (if blobSource != null then ''
      cp ${blobSource}/blobs/sha256/${hexOf d} "$out"
    '' else ''
      export HOME="$TMPDIR"
      # A caller's CA bundle (an https proxy's: why nixpkgs passes NIX_SSL_CERT_FILE) over cacert's.
      if [ -n "''${NIX_SSL_CERT_FILE:-}" ]; then export SSL_CERT_FILE="$NIX_SSL_CERT_FILE" REQUESTS_CA_BUNDLE="$NIX_SSL_CERT_FILE"; fi
      sparkstack pin fetch ${d.digest} --pins ${pinsFile} --out "$out" --no-digest-check
    '');

  parts = builtins.match "([^/]+)/([^/]+)(/([^/]+))?" platform;
  platformDoc = { os = builtins.elemAt parts 0; architecture = builtins.elemAt parts 1; }
    // (if builtins.elemAt parts 3 == null then { } else { variant = builtins.elemAt parts 3; });

  index = {
    schemaVersion = 2;
    mediaType = "application/vnd.oci.image.index.v1+json";
    manifests = [{
      inherit (pinned.manifest) mediaType digest size;
      platform = platformDoc;
      annotations."org.opencontainers.image.ref.name" = p.reference;
    }];
  };

  layout = pkgs.linkFarm "sparkstack-base-${builtins.substring 0 12 (hexOf pinned.manifest)}" (
    [
      { name = "oci-layout"; path = pkgs.writeText "oci-layout" (builtins.toJSON { imageLayoutVersion = "1.0.0"; }); }
      { name = "index.json"; path = pkgs.writeText "index.json" (builtins.toJSON index); }
    ]
    ++ map (d: { name = "blobs/sha256/${hexOf d}"; path = blob d; }) ([ pinned.manifest pinned.config ] ++ pinned.layers)
  );

  # Unresolved pins fail here, at build time, in one line; evaluation (flake show, check --no-build) still works.
  unresolved = pkgs.runCommand "sparkstack-base-unresolved" { } ''
    echo "sparkstack: error: nix/pins.json pins no ${platform} image of ${p.reference} yet: run \`nix run .#pin -- base ${p.reference}\` where the registry can be reached, then commit nix/pins.json" >&2
    exit 1
  '';
in
if parts == null then throw "mkBase: platform ${platform} is not os/arch[/variant]"
else if pinned == null then unresolved
else layout // { blobs = map blob ([ pinned.manifest pinned.config ] ++ pinned.layers); }
