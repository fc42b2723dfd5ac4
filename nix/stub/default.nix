# STAND-IN for nixpkgs (see flake.nix here): it proves the flake's wiring, not nixpkgs' own build.
#
# Names and argument signatures follow nixpkgs for what ../../flake.nix and ../*.nix use; the
# implementations are small and host-based:
#   - every derivation is `derivation { builder = "/bin/bash"; ... }` sourcing a tiny `stdenv/setup`
#     (strict bash; stdenv's SOURCE_DATE_EPOCH default of 315532800; PATH from the inputs' bin/ and
#     a set of host coreutils-like tools standing in for stdenv's);
#   - host programs (skopeo, umoci, nix) are linked into the store from /usr/bin;
#   - python3 is the host venv /opt/sparkstack-nix-stub-venv (nix/stub/make-venv: the versions
#     ../nixpkgs-versions.toml records for nixpkgs); python3Packages.* are names the stub checks that
#     venv can import; buildPythonApplication builds `src` into a wheel, fails where nixpkgs'
#     pythonRuntimeDepsCheckHook would, and installs that wheel into $out (never an editable or prior install).
# Builds are impure (host paths, host venv): fine for a stand-in, never for a real nixpkgs.
{ system }:
let
  venv = "/opt/sparkstack-nix-stub-venv";
  pythonVersion = "3.11";
  sitePackages = "lib/python${pythonVersion}/site-packages";

  # ---------------------------------------------------------------- small helpers (builtins only)
  escapeShellArg = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] (toString s) + "'";
  isDerivation = x: builtins.isAttrs x && (x.type or null) == "derivation";
  binPath = inputs: builtins.concatStringsSep ":" (map (d: "${d}/bin") (builtins.filter isDerivation inputs));
  concatMapLines = f: xs: builtins.concatStringsSep "\n" (map f xs);

  # Host tools standing in for stdenv's initial PATH: every program of these Debian packages.
  stdenvTools = derivation {
    name = "stub-stdenv-tools";
    inherit system;
    builder = "/bin/bash";
    PATH = "/usr/bin:/bin";
    args = [ "-eu" "-c" ''
      trap '(sleep 0.1) &' EXIT
      mkdir -p "$out/bin"
      for pkg in coreutils findutils diffutils sed grep gawk tar gzip bzip2 xz-utils patch bash dash; do
        dpkg -L "$pkg" 2>/dev/null | while read -r f; do
          case "$f" in /bin/*|/usr/bin/*) if [ -f "$f" ] && [ -x "$f" ]; then ln -sf "$f" "$out/bin/"; fi ;; esac
        done
      done
      [ -x "$out/bin/cp" ] && [ -x "$out/bin/sh" ]
    '' ];
  };

  # nixpkgs' stdenv/setup, reduced to what a runCommand needs. `nix develop` sources it too.
  stdenv = derivation {
    name = "stub-stdenv";
    inherit system;
    builder = "/bin/bash";
    PATH = "/usr/bin:/bin";
    setup = ''
      if [ -z "''${IN_NIX_SHELL:-}" ]; then  # building (nix develop sources this too, in its own shell)
        set -eu -o pipefail
        # NIX.md: quick builders are sometimes "killed by signal 9" without this (nix#2176).
        trap '(sleep 0.1) &' EXIT
      fi
      # As nixpkgs' stdenv does: a fixed timestamp unless the derivation sets one.
      export SOURCE_DATE_EPOCH="''${SOURCE_DATE_EPOCH:-315532800}"
      export PATH="''${stubInputsPath:+$stubInputsPath:}${stdenvTools}/bin"
    '';
    args = [ "-eu" "-c" ''trap '(sleep 0.1) &' EXIT; mkdir "$out"; printf '%s' "$setup" > "$out/setup"'' ];
  };

  mkDerivation = { name, buildCommand, inputs ? [ ], passthru ? { }, meta ? { }, ... }@attrs:
    let
      drv = derivation ((removeAttrs attrs [ "inputs" "passthru" "meta" ]) // {
        inherit name system stdenv;
        builder = "/bin/bash";
        # The build command runs at top level, not in a function: bash 5.2 prints "pop_var_context"
        # noise when errexit fires inside one.
        args = [ "-c" ''source "$stdenv/setup"; if [ -n "''${buildCommandPath:-}" ]; then source "$buildCommandPath"; else eval "$buildCommand"; fi'' ];
        stubInputsPath = binPath inputs;
      });
    in
    drv // passthru // { inherit meta passthru; };

  # ---------------------------------------------------------------- trivial builders

  # runCommand :: String -> AttrSet -> String -> Derivation
  runCommand = name: env: buildCommand:
    mkDerivation ((removeAttrs env [ "nativeBuildInputs" "buildInputs" "propagatedBuildInputs" ]) // {
      inherit name buildCommand;
      passAsFile = [ "buildCommand" ] ++ (env.passAsFile or [ ]);
      inputs = (env.nativeBuildInputs or [ ]) ++ (env.buildInputs or [ ]) ++ (env.propagatedBuildInputs or [ ]);
    });

  writeTextFile =
    { name, text, executable ? false, destination ? "", checkPhase ? "", meta ? { }, passthru ? { }
    , allowSubstitutes ? false, preferLocalBuild ? true, derivationArgs ? { } }:
    let m = builtins.match "/bin/([^/]+)" destination; in
    runCommand name
      ({
        inherit text executable checkPhase allowSubstitutes preferLocalBuild passthru;
        passAsFile = [ "text" ];
        meta = (if executable && m != null then { mainProgram = builtins.head m; } else { }) // meta;
      } // derivationArgs)
      ''
        target=$out${escapeShellArg destination}
        mkdir -p "$(dirname "$target")"
        cp "$textPath" "$target"
        if [ -n "$executable" ]; then chmod +x "$target"; fi
        eval "$checkPhase"
      '';

  writeText = name: text: writeTextFile { inherit name text; };

  writeShellApplication =
    { name, text, runtimeInputs ? [ ], runtimeEnv ? null, meta ? { }, passthru ? { }, checkPhase ? null
    , excludeShellChecks ? [ ], extraShellCheckFlags ? [ ]
    , bashOptions ? [ "errexit" "nounset" "pipefail" ], derivationArgs ? { }, inheritPath ? true }:
    writeTextFile {
      inherit name meta passthru derivationArgs;
      executable = true;
      destination = "/bin/${name}";
      allowSubstitutes = true;
      preferLocalBuild = false;
      # The host's bash stands in for nixpkgs' runtimeShell. (No shellcheck here: not installed.)
      text = "#!/bin/bash\n"
        + concatMapLines (o: "set -o ${o}") bashOptions + "\n"
        + (if runtimeEnv == null then "" else
        concatMapLines (n: "${n}=${escapeShellArg runtimeEnv.${n}}\nexport ${n}") (builtins.attrNames runtimeEnv) + "\n")
        + (if runtimeInputs == [ ] then "" else
        "\nexport PATH=\"${binPath runtimeInputs}${if inheritPath then ":$PATH" else ""}\"\n")
        + "\n" + text + "\n";
      checkPhase = if checkPhase == null then ''bash -n "$target"'' else checkPhase;
    };

  # linkFarm :: String -> ([{name, path}] | {name = path;}) -> Derivation
  linkFarm = name: entries:
    let
      entries' = if builtins.isAttrs entries then entries
        else if builtins.isList entries then builtins.foldl' (a: b: a // { ${b.name} = b.path; }) { } entries
        else throw "linkFarm entries must be either attrs or a list!";
    in
    runCommand name { preferLocalBuild = true; allowSubstitutes = false; passthru.entries = entries'; } ''
      mkdir -p "$out"
      cd "$out"
      ${concatMapLines (n: ''
        mkdir -p -- "$(dirname -- ${escapeShellArg n})"
        ln -s -- ${escapeShellArg entries'.${n}} ${escapeShellArg n}
      '') (builtins.attrNames entries')}
    '';

  mkShell =
    { name ? "nix-shell", packages ? [ ], inputsFrom ? [ ], buildInputs ? [ ], nativeBuildInputs ? [ ]
    , propagatedBuildInputs ? [ ], propagatedNativeBuildInputs ? [ ], shellHook ? "", ... }@attrs:
    assert inputsFrom == [ ]; # not stood in for: this flake does not use it
    mkDerivation ((removeAttrs attrs [ "packages" "inputsFrom" "buildInputs" "nativeBuildInputs"
      "propagatedBuildInputs" "propagatedNativeBuildInputs" ]) // {
      inherit name shellHook;
      # NIX.md: without a declared "out", `nix develop` fails ("failed to produce output path ... shell-env").
      outputs = [ "out" ];
      inputs = packages ++ nativeBuildInputs ++ buildInputs ++ propagatedBuildInputs ++ propagatedNativeBuildInputs;
      buildCommand = ''
        { echo "stub mkShell: an environment for nix develop, nothing else"; export; } >> "$out"
      '';
    });

  # ---------------------------------------------------------------- host programs

  hostTool = pname: debian: programs: runCommand "${pname}-host" { } ''
    mkdir -p "$out/bin"
    for p in ${builtins.concatStringsSep " " programs}; do
      if [ ! -x "/usr/bin/$p" ]; then
        echo "nix/stub: the host has no /usr/bin/$p (apt-get install ${debian})" >&2
        exit 1
      fi
      ln -s "/usr/bin/$p" "$out/bin/$p"
    done
  '';

  nix = hostTool "nix" "nix-bin" [ "nix" "nix-instantiate" ];

  # requireFile { name, sha256 | hash, message | url, hashMode ? "flat" }: a fixed output the user adds
  # to the store by hand (nix-store --add-fixed); building it only prints the message.
  requireFile = { name ? null, sha256 ? null, sha1 ? null, hash ? null, url ? null, message ? null, hashMode ? "flat" }:
    assert message != null || url != null;
    assert sha256 != null || sha1 != null || hash != null;
    let name' = if name == null then baseNameOf (toString url) else name; in
    runCommand name' ({
      outputHashMode = hashMode;
      preferLocalBuild = true;
      allowSubstitutes = false;
      msg = if message != null then message else "Download ${name'} from ${url} and add it with nix-store --add-fixed";
    } // (if hash != null then { outputHash = hash; outputHashAlgo = ""; }
          else if sha256 != null then { outputHash = sha256; outputHashAlgo = "sha256"; }
          else { outputHash = sha1; outputHashAlgo = "sha1"; })) ''
      printf '\n***\n%s\n***\n' "$msg" >&2
      exit 1
    '';

  cacert = runCommand "nss-cacert-host" { } ''
    mkdir -p "$out/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/ca-bundle.crt"
  '';

  # ---------------------------------------------------------------- Python

  pyWrapper = ''
    need_venv() {
      if [ ! -x ${venv}/bin/python3 ]; then
        echo "nix/stub: no host venv at ${venv}: run nix/stub/make-venv (CI does)" >&2
        exit 1
      fi
    }
    need_imports() {  # one line naming what the venv cannot import
      if ! ${venv}/bin/python3 -c "import importlib.util as u, sys; m=[n for n in sys.argv[1:] if u.find_spec(n) is None]; print(' '.join(m)) if m else None; sys.exit(1 if m else 0)" "$@" >missing 2>&1; then
        echo "nix/stub: the host venv ${venv} cannot import: $(cat missing); run nix/stub/make-venv" >&2
        exit 1
      fi
    }
    write_interpreters() {
      mkdir -p "$1/bin"
      for n in python python3 python${pythonVersion}; do
        printf '#!/bin/bash\nexec ${venv}/bin/python3 "$@"\n' > "$1/bin/$n"
        chmod +x "$1/bin/$n"
      done
    }
  '';

  importNames = ps: map (p: p.importName) (builtins.filter (p: p ? importName) ps);

  python3 =
    let
      drv = runCommand "python3-${pythonVersion}-host-venv" { } ''
        ${pyWrapper}
        need_venv
        write_interpreters "$out"
      '';
    in
    drv // {
      inherit sitePackages pythonVersion;
      executable = "python3";
      interpreter = "${drv}/bin/python3";
      pkgs = python3Packages;
      withPackages = f:
        let ps = f python3Packages; in
        runCommand "python3-${pythonVersion}-env" { passthru.stubPythonPackages = ps; } ''
          ${pyWrapper}
          need_venv
          need_imports ${builtins.concatStringsSep " " (importNames ps)}
          write_interpreters "$out"
        '';
    };

  # A package the host venv must provide: its PyPI name and the module it is imported by.
  hostPy = pname: importName: { inherit pname importName; version = "host"; pythonModule = python3; };

  # As nixpkgs' pyproject build: unpackPhase (the tree outside sourceRoot stays read-only), the wheel
  # (pypaBuildPhase), pythonRuntimeDepsCheckHook (./runtime-deps-check.py: every Requires-Dist of the
  # wheel satisfied by the installed version, else one line each and the build fails), the install,
  # wrapPythonPrograms, and pythonImportsCheck (every module named, in one interpreter).
  buildPythonApplication =
    { pname, version, src, pyproject ? null, format ? null, sourceRoot ? null
    , build-system ? [ ], dependencies ? [ ], optional-dependencies ? { }
    , nativeBuildInputs ? [ ], buildInputs ? [ ], nativeCheckInputs ? [ ], doCheck ? false
    , pythonImportsCheck ? [ ], pythonRelaxDeps ? [ ], preBuild ? "", meta ? { }, passthru ? { }, ... }:
    assert pyproject == true; # the only build path this stand-in has
    assert builtins.isList pythonRelaxDeps; # nixpkgs also takes `true`; this flake relaxes nothing
    runCommand "${pname}-${version}"
      {
        inherit src preBuild;
        nativeBuildInputs = nativeBuildInputs;
        passthru = passthru // { inherit dependencies optional-dependencies; };
        inherit meta;
      }
      ''
        ${pyWrapper}
        need_venv
        need_imports packaging ${builtins.concatStringsSep " " (importNames (build-system ++ dependencies))}
        # unpackPhase: the source dir is named after its store path, minus the hash; copied with the
        # store's read-only modes, and only sourceRoot made writable.
        name=$(basename "$src"); name=''${name#*-}
        cp -r --preserve=timestamps "$src" "$name"
        sourceRoot=${if sourceRoot == null then "\"$name\"" else escapeShellArg sourceRoot}
        chmod -R u+w -- "$sourceRoot"
        cd "$sourceRoot"
        eval "$preBuild"
        ${venv}/bin/python3 -m pip wheel --quiet --no-deps --no-index --no-build-isolation --no-cache-dir \
          --disable-pip-version-check -w "$TMPDIR/dist" .
        ${venv}/bin/python3 ${./runtime-deps-check.py} "$TMPDIR"/dist/*.whl \
          --relax ${builtins.concatStringsSep " " (map escapeShellArg pythonRelaxDeps)}
        ${venv}/bin/python3 -m pip install --quiet --no-deps --no-index --no-cache-dir \
          --disable-pip-version-check --no-warn-script-location --prefix "$out" "$TMPDIR"/dist/*.whl
        # wrapPythonPrograms, by hand: each script runs the venv's python with $out's site-packages first.
        for f in "$out"/bin/*; do
          n=$(basename "$f")
          mv "$f" "$out/bin/.$n-wrapped"
          {
            echo "#!${venv}/bin/python3"
            echo "import sys; sys.path.insert(0, '$out/${sitePackages}'); sys.argv[0] = '$out/bin/$n'"
            echo "exec(compile(open('$out/bin/.$n-wrapped').read(), '$out/bin/.$n-wrapped', 'exec'))"
          } > "$out/bin/$n"
          chmod +x "$out/bin/$n"
        done
        PYTHONPATH=$out/${sitePackages} ${venv}/bin/python3 -c 'import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]' \
          ${builtins.concatStringsSep " " (map escapeShellArg pythonImportsCheck)}
      '';

  python3Packages = {
    python = python3;
    inherit buildPythonApplication;
    # The runtime dependencies and build system of sparkstack, and its test extra.
    setuptools = hostPy "setuptools" "setuptools";
    wheel = hostPy "wheel" "wheel";
    pip = hostPy "pip" "pip";
    click = hostPy "click" "click";
    rich = hostPy "rich" "rich";
    huggingface-hub = hostPy "huggingface-hub" "huggingface_hub";
    zstandard = hostPy "zstandard" "zstandard";
    installer = hostPy "installer" "installer";
    requests = hostPy "requests" "requests";
    urllib3 = hostPy "urllib3" "urllib3";
    prometheus-client = hostPy "prometheus-client" "prometheus_client";
    tomlkit = hostPy "tomlkit" "tomlkit";
    plumbum = hostPy "plumbum" "plumbum";
    matplotlib = hostPy "matplotlib" "matplotlib";
    pytest = hostPy "pytest" "pytest";
    pytest-xdist = hostPy "pytest-xdist" "xdist";
    hypothesis = hostPy "hypothesis" "hypothesis";
    safetensors = hostPy "safetensors" "safetensors";
    numpy = hostPy "numpy" "numpy";
    torch = hostPy "torch" "torch";
  };
in
{
  inherit system runCommand writeText writeTextFile writeShellApplication linkFarm mkShell requireFile cacert
    python3 python3Packages;
  inherit nix;
  # `nix develop` looks this up in nixpkgs for its interactive shell.
  bashInteractive = hostTool "bash-interactive" "bash" [ "bash" ];
  skopeo = hostTool "skopeo" "skopeo" [ "skopeo" ];
  umoci = hostTool "umoci" "umoci" [ "umoci" ];
  # nixpkgs' formatter; here a stand-in that only checks that each file parses and changes nothing.
  nixfmt = writeShellApplication {
    name = "nixfmt";
    runtimeInputs = [ nix ];
    text = ''
      echo "nixfmt (nix/stub stand-in): checks that each .nix file parses; formats nothing" >&2
      status=0
      while IFS= read -r -d "" f; do
        nix-instantiate --parse "$f" >/dev/null || { echo "does not parse: $f" >&2; status=1; }
      done < <(find "''${@:-.}" -name '*.nix' -not -path '*/.git/*' -print0)
      exit "$status"
    '';
  };
}
