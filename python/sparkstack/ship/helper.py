"""The far side of `sparkstack ship`: a stdlib-only program that runs on a worker with nothing but python3.

It is not imported there: its source travels zlib-compressed over ssh's stdin behind the one-line
bootstrap in wire.py, so a worker needs sshd, coreutils, python3 (>= 3.8) and docker, and no sparkstack.

One JSON request line on stdin, JSON reply lines on stdout. Operations:
- inventory: which blobs this host holds (verified), what its docker holds, how much room there is.
  With "readonly" it writes nothing at all (the dry run).
- recv: a loop of blob frames. Each blob is appended to a hidden partial file beside its final name,
  hashed while it arrives (one pass), fsynced, and renamed into place only when its hash matches its
  name. A partial left by a killed ship is offered back as (length, sha256 of that prefix); the sender
  compares it with its own bytes and resumes there or starts over. Size alone never counts.
- finish: check every blob again, rebuild snapshot links and refs of cache entries, and stream an image
  from the blob store into `docker load` (no temporary tar), checking each blob as it passes.

Every path in a request is relative to one of two roots resolved here: the blob store
($XDG_DATA_HOME/sparkstack, default ~/.local/share/sparkstack) and the HF hub (`~` expanded here).
What a file is verified as is remembered by its stat identity under the store's `verified/`; any write
to it (a new mtime or ctime) makes the next inventory hash it again.
"""

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import threading

CHUNK = 1 << 20
PROTOCOL = 1
_HEX = set("0123456789abcdef")
_IN = sys.stdin.buffer
_OUT = sys.stdout.buffer


class Refused(Exception):
    """A request this helper will not carry out; its text goes back as the one-line error."""


def reply(doc):
    _OUT.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")
    _OUT.flush()


def read_json_line():
    line = _IN.readline()
    if not line:
        return None
    return json.loads(line)


# ---------------------------------------------------------------- where things are on this host


def store_root():
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "sparkstack")


def roots(req):
    hub = req.get("hub")
    found = {"store": store_root()}
    if isinstance(hub, str) and hub:
        found["hub"] = os.path.expanduser(hub)
    return found


def under(root, rel):
    """root/rel for a plain relative path: no absolute path, no '..', no empty or '.' component."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel or "\\" in rel:
        raise Refused("bad relative path %s" % brief(rel))
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise Refused("bad relative path %s" % brief(rel))
    return os.path.join(root, *parts)


def brief(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_digest(algo, digest):
    want = {"sha256": 64, "git-sha1": 40}.get(algo)
    if want is None or not isinstance(digest, str) or len(digest) != want or not set(digest) <= _HEX:
        raise Refused("bad digest %s for %s" % (brief(digest), brief(algo)))


def new_hash(algo, size):
    if algo == "sha256":
        return hashlib.sha256()
    h = hashlib.sha1()
    h.update(b"blob %d\0" % size)  # git's blob header: the hub names small files this way
    return h


def free_bytes(path):
    """(free bytes, device) of the filesystem that holds or will hold `path`."""
    p = path
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize, os.stat(p).st_dev, p


# ---------------------------------------------------------------- what has been verified


def identity(st):
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink]


def same_file(saved, now):
    """The very file that was verified, unwritten since. Any write changes the ctime; the one ctime change
    forgiven is one that comes with a new link count (someone hardlinked the blob elsewhere)."""
    if not isinstance(saved, list) or len(saved) != 6 or saved[:4] != now[:4]:
        return False
    return saved[4] == now[4] or saved[5] != now[5]


def record_path(path):
    key = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(store_root(), "verified", key)


def recorded(path, algo, digest, st):
    try:
        with open(record_path(path)) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return False
    return (isinstance(rec, dict) and rec.get("path") == os.path.abspath(path) and rec.get("algo") == algo
            and rec.get("digest") == digest and same_file(rec.get("id"), identity(st)))


def write_atomic(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remember(path, algo, digest):
    st = os.stat(path)
    doc = {"path": os.path.abspath(path), "algo": algo, "digest": digest, "id": identity(st)}
    write_atomic(record_path(path), json.dumps(doc).encode())


def hash_file(path, algo, size):
    h = new_hash(algo, size)
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def blob_state(path, algo, digest, size, readonly):
    """present (verified now or before), partial (with its length), missing, or corrupt."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISREG(st.st_mode) and st.st_size == size:
            if recorded(path, algo, digest, st):
                return {"state": "present"}
            if hash_file(path, algo, size) == digest:
                if not readonly:
                    remember(path, algo, digest)
                return {"state": "present", "hashed": True}
        return {"state": "corrupt"}
    try:
        have = os.stat(partial_path(path)).st_size
    except FileNotFoundError:
        return {"state": "missing"}
    return {"state": "partial", "have": min(have, size)}


def partial_path(path):
    d, name = os.path.split(path)
    return os.path.join(d, ".%s.sparkstack-partial" % name)


# ---------------------------------------------------------------- docker


def docker_argv(host, *args):
    return ["docker"] + (["-H", host] if host else []) + list(args)


def run(argv, timeout=120):
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, b"", b"timed out")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, b"", str(exc).encode())


def last_line(proc):
    text = (proc.stderr or proc.stdout or b"").decode(errors="replace").strip()
    return text.splitlines()[-1] if text else "exit %d" % proc.returncode


def image_id(host, ref):
    proc = run(docker_argv(host, "image", "inspect", "--format", "{{.Id}}", ref), timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    text = proc.stdout.decode().split()[0]
    return text if text.startswith("sha256:") else "sha256:" + text


def docker_state(host, config_digest, name, diff_ids=()):
    if shutil.which("docker") is None:
        return {"error": "docker is not installed (no docker on PATH)"}
    proc = run(docker_argv(host, "version", "--format", "{{.Server.Version}}"), timeout=60)
    if proc.returncode != 0:
        return {"error": "docker is not reachable: " + last_line(proc)}
    holds = image_id(host, config_digest) == config_digest
    named = holds and (not name or image_id(host, name) == config_digest)
    held = 0 if holds else layers_held(host, list(diff_ids))
    return {"error": None, "version": proc.stdout.decode().strip(), "holds": holds, "named": named,
            "layers_held": held}


def layers_held(host, diff_ids):
    """How many of the image's first layers docker already has, as one chain, under any image it holds.

    docker load skips a layer whose chain it has without opening its file, so those layers need to be
    neither sent nor streamed into the load (a rebuilt image over an already-loaded base: only the top)."""
    if not diff_ids:
        return 0
    proc = run(docker_argv(host, "images", "-q", "--no-trunc"), timeout=120)
    ids = sorted(set(proc.stdout.decode(errors="replace").split())) if proc.returncode == 0 else []
    if not ids:
        return 0
    proc = run(docker_argv(host, "image", "inspect", "--format", "{{json .RootFS.Layers}}", *ids), timeout=300)
    best = 0
    for line in proc.stdout.decode(errors="replace").splitlines():  # an image removed meanwhile just fails alone
        try:
            layers = json.loads(line)
        except ValueError:
            continue
        if not isinstance(layers, list):
            continue
        n = 0
        while n < min(len(layers), len(diff_ids)) and layers[n] == diff_ids[n]:
            n += 1
        best = max(best, n)
    return best


# ---------------------------------------------------------------- inventory


def op_inventory(req):
    readonly = bool(req.get("readonly", True))
    where = roots(req)
    out = {"ok": True, "protocol": PROTOCOL, "python": sys.version.split()[0], "home": os.path.expanduser("~"),
           "roots": where, "blobs": {}, "docker": None, "entries": {}, "free": {}}
    image = req.get("image")
    if image:
        out["docker"] = docker_state(image.get("docker_host"), image["config_digest"], image.get("name"),
                                     image.get("diff_ids") or ())
    skip_image = bool(image) and (out["docker"].get("error") is not None or out["docker"].get("holds"))
    for blob in req.get("blobs", []):
        if skip_image and blob["area"] == "store":
            continue  # docker holds the image already, or cannot load one: its blobs are not needed
        check_digest(blob["algo"], blob["digest"])
        path = under(where[blob["area"]], blob["dir"] + "/" + blob["name"])
        out["blobs"][blob["key"]] = blob_state(path, blob["algo"], blob["digest"], blob["size"], readonly)
    for entry in req.get("entries", []):
        out["entries"][entry["name"]] = entry_state(where["hub"], entry)
    for area, root in where.items():
        free, dev, at = free_bytes(root)
        out["free"][area] = {"bytes": free, "device": dev, "at": at}
    reply(out)


def entry_state(hub, entry):
    """Is the snapshot already exactly these links, and does refs/main already name the revision?"""
    snap = under(hub, entry["snapshot"])
    return {"snapshot_current": snapshot_matches(snap, entry["links"]),
            "ref_current": read_text(under(hub, entry["ref"])) == entry["revision"]}


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read(256).decode(errors="replace").strip()
    except OSError:
        return None


def snapshot_matches(snap, links):
    want = {rel: target for rel, _blob, target in links}
    found = {}
    if not os.path.isdir(snap):
        return False
    for dirpath, dirnames, filenames in os.walk(snap):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, snap).replace(os.sep, "/")
            if not os.path.islink(p):
                return False
            found[rel] = os.readlink(p)
    return found == want


# ---------------------------------------------------------------- recv


def op_recv(req):
    where = roots(req)
    buf = bytearray(CHUNK)
    try:
        fcntl.fcntl(_IN.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ: fewer wakeups per MiB (best effort)
    except OSError:
        pass
    reply({"ok": True, "protocol": PROTOCOL})
    while True:
        frame = read_json_line()
        if frame is None:
            return
        blob = frame["blob"]
        check_digest(blob["algo"], blob["digest"])
        size = blob["size"]
        if not isinstance(size, int) or size < 0:
            raise Refused("bad size %r" % (size,))
        dest = under(where[blob["area"]], blob["dir"] + "/" + blob["name"])
        if not receive_one(dest, blob["algo"], blob["digest"], size, buf):
            return


def receive_one(dest, algo, digest, size, buf):
    """Receive one blob into `dest`. False when the sender went away mid-blob (the partial stays)."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    part = partial_path(dest)
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another ship to this host waits here, then finds the blob done
        if blob_state(dest, algo, digest, size, readonly=False)["state"] == "present":
            _drop_if_ours(part, fd)
            reply({"have": "complete"})
            return True
        have = os.fstat(fd).st_size
        if have > size:
            os.ftruncate(fd, 0)
            have = 0
        h = new_hash(algo, size)
        check = h if algo == "sha256" else hashlib.sha256()
        pos = 0
        while pos < have:  # the prefix a killed ship left: hashed once, here, and never re-read
            n = os.preadv(fd, [memoryview(buf)[:min(CHUNK, have - pos)]], pos)
            if n <= 0:
                break
            view = memoryview(buf)[:n]
            h.update(view)
            if check is not h:
                check.update(view)
            pos += n
        have = pos
        reply({"have": have, "prefix": check.copy().hexdigest()})
        answer = read_json_line()
        if answer is None:
            return False
        offset = answer.get("offset")
        if offset not in (0, have):
            raise Refused("bad resume offset %r" % (offset,))
        if offset == 0 and have:
            os.ftruncate(fd, 0)
            h = new_hash(algo, size)
        os.lseek(fd, offset, os.SEEK_SET)
        left = size - offset
        while left:
            n = _IN.readinto(memoryview(buf)[:min(CHUNK, left)])
            if not n:
                return False  # the sender is gone: keep what arrived, the next ship checks it and resumes
            view = memoryview(buf)[:n]
            h.update(view)
            try:
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            except OSError as exc:  # ENOSPC above all: what arrived stays, as a prefix to resume from
                raise Refused("%s: %s" % (dest, exc.strerror or exc))
            left -= n
        os.fsync(fd)
        if h.hexdigest() != digest:
            os.unlink(part)
            reply({"ok": False, "mismatch": True,
                   "error": "%s arrived with %s %s, not %s; removed" % (dest, algo, h.hexdigest(), digest)})
            return True
        os.rename(part, dest)  # only now does the name exist: verified bytes, or nothing
        fsync_dir(os.path.dirname(dest))
        remember(dest, algo, digest)
        reply({"ok": True})
        return True
    finally:
        os.close(fd)


def _drop_if_ours(part, fd):
    """Remove the empty partial this call created for a blob that turned out complete."""
    try:
        if os.fstat(fd).st_size == 0 and os.path.samestat(os.fstat(fd), os.stat(part)):
            os.unlink(part)
    except OSError:
        pass


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- finish: entries


def op_finish(req):
    where = roots(req)
    out = {"ok": True, "entries": {}, "image": None}
    for entry in req.get("entries", []):
        out["entries"][entry["name"]] = finish_entry(where["hub"], entry)
    image = req.get("image")
    if image:
        out["image"] = finish_image(where["store"], image)  # "resend" lists blobs to send (again)
    reply(out)


def verify_all(root, blobs):
    """Every blob named, checked again (cheaply, by its verification record, else by hashing)."""
    bad = []
    for blob in blobs:
        check_digest(blob["algo"], blob["digest"])
        path = under(root, blob["dir"] + "/" + blob["name"])
        if blob_state(path, blob["algo"], blob["digest"], blob["size"], readonly=False)["state"] != "present":
            bad.append(blob["key"])
    return bad


def finish_entry(hub, entry):
    bad = verify_all(hub, entry["blobs"])
    if bad:
        raise Refused("%s: %d blob(s) missing or not verified, e.g. %s; snapshot not rebuilt"
                      % (entry["name"], len(bad), bad[0]))
    lock = under(hub, entry["lock"])
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    with open(lock, "a") as lk:
        fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
        snap = under(hub, entry["snapshot"])
        blobs_dir = under(hub, entry["blobs_dir"])
        if snapshot_matches(snap, entry["links"]):
            snapshot = "up to date"
        else:
            rebuild_snapshot(snap, blobs_dir, entry["links"])
            snapshot = "rebuilt"
        ref = under(hub, entry["ref"])
        if read_text(ref) == entry["revision"]:
            ref_state = "up to date"
        else:
            write_atomic(ref, entry["revision"].encode())
            fsync_dir(os.path.dirname(ref))
            ref_state = "written"
    return {"snapshot": snapshot, "ref": ref_state}


def rebuild_snapshot(snap, blobs_dir, links):
    """Stage every link beside the snapshot, then swap it in: readers see the old snapshot or the new one."""
    parent = os.path.dirname(snap)
    os.makedirs(parent, exist_ok=True)
    stage = os.path.join(parent, ".%s.sparkstack-%d" % (os.path.basename(snap), os.getpid()))
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    for rel, blob, target in links:
        link = under(stage, rel)
        # The link must land on this entry's blob, whatever the sender said the target was.
        lands = os.path.normpath(os.path.join(os.path.dirname(under(snap, rel)), target))
        if "/" in blob or lands != os.path.normpath(os.path.join(blobs_dir, blob)):
            raise Refused("link %r -> %r does not point at blob %r" % (rel, target, blob))
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(target, link)
    for dirpath, _dirs, _files in os.walk(stage):
        fsync_dir(dirpath)
    old = None
    if os.path.lexists(snap):
        for dirpath, dirnames, filenames in os.walk(snap):
            for name in filenames:
                p = os.path.join(dirpath, name)
                if not os.path.islink(p):  # a real file is data, not a link: never thrown away here
                    shutil.rmtree(stage, ignore_errors=True)
                    raise Refused("%s is a regular file, not a link into blobs/; refusing to replace the snapshot" % p)
        if os.path.isdir(snap) and not os.path.islink(snap) and exchange(stage, snap):
            fsync_dir(parent)  # readers saw the old links, then the new: never no snapshot at all
            shutil.rmtree(stage, ignore_errors=True)  # the old links, now under the staged name
            return
        old = os.path.join(parent, ".%s.sparkstack-old-%d" % (os.path.basename(snap), os.getpid()))
        os.rename(snap, old)
    os.rename(stage, snap)
    fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # links and dirs only: blobs are never touched


def exchange(a, b):
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE); False where this host cannot."""
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (ImportError, OSError, AttributeError):
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    if fn(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), b)


# ---------------------------------------------------------------- finish: the image


def finish_image(store, image):
    host, config, name = image.get("docker_host"), image["config_digest"], image.get("name")
    state = docker_state(host, config, name, image.get("diff_ids") or ())
    if state.get("error"):
        raise Refused(state["error"])
    result = {"loaded": False, "already_loaded": state["holds"], "tagged": False, "resend": [],
              "layers_held": state["layers_held"]}
    if state["holds"]:
        if not state["named"]:
            proc = run(docker_argv(host, "tag", config, name))
            if proc.returncode != 0:
                raise Refused("docker tag: " + last_line(proc))
            result["tagged"] = True
    else:
        skip = state["layers_held"]  # asked again now: what docker has may have changed since the inventory
        needed = set([config] + list(image["layers"][skip:]))
        bad = verify_all(store, [b for b in image["blobs"] if "sha256:" + b["digest"] in needed])
        if bad:
            result["resend"] = bad  # missing or corrupt here: the head sends them and asks again
            return result
        corrupt = load_into_docker(store, image, skip)
        if corrupt:
            result["resend"] = [corrupt]
            return result
        result["loaded"] = True
    got = image_id(host, name or config)
    if got != config:
        raise Refused("docker holds %s as %s, not the config digest %s" % (name or config, got, config))
    if not verify_all(store, image["blobs"]):  # a complete image in the store: readable as an OCI layout
        write_layout(store, image)
    return result


def blob_file(store, digest):
    algo, _, hexpart = digest.partition(":")
    check_digest(algo, hexpart)
    return under(store, "blobs/sha256/" + hexpart)


def _tar_header(name, size):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(format=tarfile.GNU_FORMAT)  # GNU base-256 sizes carry blobs over 8 GiB


def _pad(size):
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def load_into_docker(store, image, skip=0):
    """Stream a docker-archive made on the fly from the store into `docker load`. Returns the key of a
    blob that failed its hash on the way (the load is killed before its member ends), else None.

    manifest.json lists every layer; the files of the first `skip` (docker holds their chain) are left
    out: docker never opens them, and would only have copied them to its scratch dir."""
    config_hex = image["config_digest"].split(":", 1)[1]
    manifest = json.dumps([{"Config": "blobs/sha256/" + config_hex, "RepoTags": [image["name"]] if image.get("name") else [],
                            "Layers": ["blobs/sha256/" + d.split(":", 1)[1] for d in image["layers"]]}]).encode()
    proc = subprocess.Popen(docker_argv(image.get("docker_host"), "load"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err_chunks = []
    t = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    o = threading.Thread(target=lambda: proc.stdout.read(), daemon=True)
    t.start()
    o.start()
    bad = None
    try:
        pipe = proc.stdin
        pipe.write(_tar_header("manifest.json", len(manifest)) + manifest + _pad(len(manifest)))
        done = set()
        for digest in [image["config_digest"]] + list(image["layers"][skip:]):
            if digest in done:
                continue
            done.add(digest)
            path = blob_file(store, digest)
            size = os.stat(path).st_size
            pipe.write(_tar_header("blobs/sha256/" + digest.split(":", 1)[1], size))
            h = hashlib.sha256()
            with open(path, "rb") as f:
                left = size
                while left:
                    chunk = f.read(min(CHUNK, left))
                    if not chunk:
                        break
                    h.update(chunk)
                    left -= len(chunk)
                    if not left and "sha256:" + h.hexdigest() != digest:
                        bad = digest  # checked before the member's last bytes go: docker never commits it
                        break
                    pipe.write(chunk)
            if bad:
                forget_blob(path)
                break
            pipe.write(_pad(size))
        if not bad:
            pipe.write(b"\0" * (2 * tarfile.BLOCKSIZE))
            pipe.close()
    except BrokenPipeError:
        pass
    finally:
        if bad:
            proc.kill()
    code = proc.wait()
    t.join(30)
    if bad:
        return bad
    if code != 0:
        text = b"".join(c for c in err_chunks if c).decode(errors="replace").strip().splitlines()
        raise Refused("docker load exited %d: %s" % (code, text[-1] if text else "no output"))
    return None


def forget_blob(path):
    """A store blob that no longer matches its name: removed, so the next ship sends it again."""
    for p in (path, record_path(path)):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def write_layout(store, image):
    """images/<config hex>/ as an OCI layout over the shared blobs: this host's store can be read like any layout."""
    d = under(store, "images/" + image["config_digest"].split(":", 1)[1])
    os.makedirs(d, exist_ok=True)
    if not os.path.lexists(os.path.join(d, "blobs")):
        os.symlink("../../blobs", os.path.join(d, "blobs"))
    write_atomic(os.path.join(d, "oci-layout"), b'{"imageLayoutVersion":"1.0.0"}')
    write_atomic(os.path.join(d, "index.json"),
                 json.dumps({"schemaVersion": 2, "manifests": [image["index_entry"]]}, sort_keys=True).encode())


# ---------------------------------------------------------------- main

OPS = {"inventory": op_inventory, "recv": op_recv, "finish": op_finish}


def main():
    try:
        req = read_json_line()
        if not isinstance(req, dict) or req.get("protocol") != PROTOCOL or req.get("op") not in OPS:
            raise Refused("not a ship request of protocol %d" % PROTOCOL)
        OPS[req["op"]](req)
    except Refused as exc:
        reply({"ok": False, "error": str(exc)})
        sys.exit(1)
    except OSError as exc:
        where = ": %s" % exc.filename if exc.filename else ""
        reply({"ok": False, "error": "%s%s" % (exc.strerror or exc, where)})
        sys.exit(1)
    except (KeyError, TypeError, ValueError) as exc:
        reply({"ok": False, "error": "malformed request (%s: %s)" % (type(exc).__name__, exc)})
        sys.exit(1)


if sys.version_info < (3, 8):
    _OUT.write(b'{"ok":false,"error":"python3 on this host is older than 3.8"}\n')
    _OUT.flush()
    sys.exit(1)
if __name__ == "__main__":  # also true under the bootstrap's exec(); importing this module runs nothing
    main()
